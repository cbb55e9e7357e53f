"""Checks a builder model against the same model in torch on the CPU, on full tensors:
the forward output (on the GPU, after compiling the infer program) and one complete
training step (the loss and every trainable parameter's gradient)."""
from __future__ import annotations

import numpy as np
import torch

from meganeura.compiler import compile_graph, compile_model, run_graph
from meganeura.compiler.ir.autodiff import gradients
from meganeura.compiler.ir.emit import Emitter
from meganeura.compiler.ir.training import ROW_MASK, train_mode
from meganeura.runtime import Package, Session


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def state_dict_numpy(module: torch.nn.Module) -> dict:
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in module.state_dict().items()}


def check_forward(model, torch_fn, inputs: dict, device, output: str | None = None, tol: float = 1e-4):
    """GPU infer output vs torch_fn(**inputs as float64 tensors) and the float64 interpreter."""
    out_name = output or next(iter(model.graph.outputs))
    with torch.no_grad():
        ref = torch_fn(**{k: torch.tensor(v) for k, v in inputs.items()})
    ref = ref.detach().double().numpy()
    interp = run_graph(model.graph, inputs, np.float64)[0][out_name]
    session = Session(device, Package.from_bytes(compile_model(model)))
    gpu = session.run("infer", inputs)[out_name]
    errors = {"interpreter": rel(interp, ref), "gpu": rel(gpu, ref)}
    assert errors["interpreter"] < 1e-6, errors
    assert errors["gpu"] < tol, errors
    return errors


def check_training_step(model, torch_module, torch_loss_fn, inputs: dict, labels, device, loss: str = "mse",
                        output: str | None = None, tol: float = 1e-4):
    """Loss and every trainable parameter's gradient, from the GPU, vs torch autograd.

    torch_loss_fn(module, inputs as tensors, labels tensor) -> scalar loss, with the module
    in train() mode (batch norms use batch statistics) in float64."""
    g = train_mode(model.graph)
    e = Emitter(g)
    out_name = output or next(iter(g.outputs))
    pred = g.outputs[out_name]
    rows = g.nodes[pred].shape[0]
    if loss == "cross_entropy":
        lab = e.leaf("input", "labels", (rows,), "i32")
    else:
        lab = e.leaf("input", "labels", g.nodes[pred].shape, "f32")
    mask = e.leaf("input", ROW_MASK, (rows,), "f32")
    loss_id = e.op(loss, pred, lab, mask)
    trainable = {n: i for n, i in g.params.items() if n not in g.frozen}
    grads = gradients(e, loss_id, list(trainable.values()))
    g.outputs = {"loss": loss_id, **{f"grad:{n}": grads[i] for n, i in trainable.items() if i in grads}}
    g.assigns = {}
    feed = {**inputs, "labels": labels, ROW_MASK: np.ones(rows)}
    session = Session(device, Package.from_bytes(compile_graph(g)))
    gpu = session.run("infer", feed)
    interp = run_graph(g, feed, np.float64)[0]

    module = torch_module.double().train()
    module.zero_grad()
    tl = torch_loss_fn(module, {k: torch.tensor(v) for k, v in inputs.items()}, torch.tensor(labels))
    tl.backward()
    tgrads = {k: p.grad for k, p in module.named_parameters() if p.requires_grad}
    errors = {"loss": (rel(interp["loss"], tl.item()), rel(gpu["loss"], tl.item()))}
    missing = [n for n in trainable if f"grad:{n}" not in gpu and tgrads.get(n) is not None]
    assert not missing, f"no gradient for {missing}"
    for n in trainable:
        t = tgrads.get(n)
        if t is None:
            continue
        t = t.numpy()
        errors[n] = (rel(interp[f"grad:{n}"], t), rel(gpu[f"grad:{n}"], t))
    bad = {k: v for k, v in errors.items() if v[0] > 1e-6 or v[1] > tol}
    assert not bad, f"gradients off (interpreter, gpu): {bad}"
    return errors

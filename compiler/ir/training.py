"""Turns a forward model into one training step: loss, gradients, optimizer update.

The step is data in the same Graph: a `loss` output, and `assigns` that replace each
trainable parameter and each optimizer state tensor with its updated value. The
optimizers are elementwise nodes, which the scheduler fuses into one update kernel per
parameter; with the parameters laid out in groups (ir/groups.py, passes/arenas.py) the package writer
widens each group's kernels into one.
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field

import numpy as np

from ..options import DEFAULT, CompileOptions
from .autodiff import gradients
from .emit import Emitter
from .graph import Graph
from .groups import layout
from .ops_layers import batch_statistics

ROW_MASK = "__row_mask"  # hidden input: 1 for real rows of a batch, 0 for padding
EXACT_INT = 1 << 24  # integers of smaller magnitude are exact in f32: labels compare as floats


@dataclass
class TrainConfig:
    """The training recipe: compile_model(model, TrainConfig(...)) adds the program "train_step".

    Attributes:
        loss: "cross_entropy" (labels: class ids) or "mse" (labels: the output's shape).
        optimizer: "adamw" or "sgd".
        lr: the learning rate (the state tensor "optimizer.lr" at run time).
        momentum: SGD's momentum.
        betas: AdamW's moment decay rates.
        eps: AdamW's epsilon.
        weight_decay: None: 0.01 for AdamW (PyTorch's default), 0 for SGD.
        clip_norm: clip the global gradient norm to this, as clip_grad_norm_; None: no clipping.
        freeze: glob patterns of parameter names that get no gradient work at all.
        output: the model output the loss reads; None: the only one.
        skip_nonfinite: a step whose loss or a gradient is NaN/inf changes nothing and is
            counted (`Session.skipped_steps`); with cross_entropy also a step with a label
            outside the classes (other than ignore_index), or with no row left.
        ignore_index: cross_entropy: rows with this label leave the loss, as in PyTorch.
        lora_rank: train LoRA adapters of this rank instead of the weights they sit beside.
        lora_targets: globs of the parameter (or ONNX node) names that get adapters.
        lora_alpha: the adapters' scale is lora_alpha / lora_rank.
        lora_seed: seeds the adapters' initial values.
        memory_budget: bytes (or a size such as "256MiB", "1.5GB") the step's buffers may take:
            the compiler recomputes forward values in the backward pass until they fit
            (passes/remat.py); None: every value the backward reads is kept.
    """

    loss: str = "cross_entropy"  # or "mse"
    optimizer: str = "adamw"  # or "sgd"
    lr: float = 1e-3
    momentum: float = 0.9  # sgd
    betas: tuple = (0.9, 0.999)  # adamw
    eps: float = 1e-8
    weight_decay: float | None = None  # None: 0.01 for adamw (PyTorch's default), 0 for sgd
    clip_norm: float | None = None  # clip the global gradient norm, as clip_grad_norm_
    freeze: list = field(default_factory=list)  # glob patterns of parameter names
    output: str | None = None  # which model output the loss reads; default: the only one
    # a step with a NaN/inf loss or gradient changes nothing (counted); with cross_entropy also a
    # step with a label outside the classes (other than ignore_index), or with no row left
    skip_nonfinite: bool = True
    ignore_index: int = -100  # cross_entropy: rows with this label leave the loss, as in PyTorch
    lora_rank: int | None = None  # LoRA: ir/lora.py
    lora_targets: list = field(default_factory=list)
    lora_alpha: float = 8.0  # PEFT's default
    lora_seed: int = 0
    memory_budget: int | str | None = None  # passes/remat.py


def frozen_names(graph: Graph, patterns) -> set:
    names = set(graph.params)
    out = {n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)} | (graph.frozen & names)
    return out


def build_training_graph(forward: Graph, cfg: TrainConfig, options: CompileOptions = DEFAULT) -> Graph:
    if cfg.loss not in ("cross_entropy", "mse"):
        raise ValueError(f"unknown loss {cfg.loss!r}: use cross_entropy or mse")
    if cfg.optimizer not in ("sgd", "adamw"):
        raise ValueError(f"unknown optimizer {cfg.optimizer!r}: use sgd or adamw")
    g = train_mode(forward)
    e = Emitter(g)
    out_name = cfg.output or _only_output(g)
    pred = g.outputs[out_name]
    shape = g.nodes[pred].shape
    rows = shape[0] if shape else 1
    if "labels" in g.inputs:
        raise ValueError("the model already has an input named 'labels'")
    if cfg.loss == "cross_entropy":
        if len(shape) != 2:
            raise ValueError(f"cross_entropy needs [batch, classes] output, '{out_name}' is {list(shape)}")
        labels = e.leaf("input", "labels", (rows,), "i32")
    else:
        labels = e.leaf("input", "labels", shape, "f32")
    mask = e.leaf("input", ROW_MASK, (rows,), "f32")
    rejects = None
    if cfg.loss == "cross_entropy":
        mask, rejects = label_checks(e, labels, mask, shape[1], cfg.ignore_index)
    loss = e.op(cfg.loss, pred, labels, mask)
    g.outputs = {"loss": loss}
    return attach_optimizer(g, loss, cfg, rejects, options)


def label_checks(e, labels, row_mask, classes, ignore_index=-100, empty_rejects: bool = True):
    """The rows cross-entropy averages over, and why a step must not be taken.

    Returns (mask, rejects): mask is 1 for real rows whose label is not `ignore_index`
    (torch's cross_entropy(ignore_index=...) averages over those); rejects is a scalar,
    the number of those rows whose label is outside [0, classes), plus 1 when no row is
    left (`empty_rejects`). The labels are checked here, on the GPU, whoever wrote them.
    """
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise TypeError(f"ignore_index must be an integer, not {ignore_index!r}")
    if abs(int(ignore_index)) >= EXACT_INT:
        raise ValueError(f"ignore_index must lie within +-{EXACT_INT - 1}, not {ignore_index}")
    as_float = e.op("cast", labels, to="f32")
    ignored = e.op("eq", as_float, e.const(int(ignore_index)))
    kept = e.op("mul", row_mask, e.op("sub", e.const(1.0), ignored))
    # 0 <= label < classes, for integers: label > -0.5 and classes - 0.5 > label
    in_range = e.op("mul", e.op("step", e.op("add", as_float, e.const(0.5))),
                    e.op("step", e.op("sub", e.const(classes - 0.5), as_float)))
    bad = e.op("reduce_sum", e.op("mul", kept, e.op("sub", e.const(1.0), in_range)), axes=(0,), keepdims=False)
    if not empty_rejects:
        return kept, bad
    empty = e.op("eq", e.op("reduce_sum", kept, axes=(0,), keepdims=False), e.const(0.0))
    return kept, e.op("add", bad, empty)


def attach_optimizer(g: Graph, loss: int, cfg: TrainConfig, rejects: int | None = None,
                     options: CompileOptions = DEFAULT) -> Graph:
    """Adds gradients of `loss` and the optimizer's updates (as assigns) to graph `g`,
    for every parameter not frozen by `cfg.freeze` or the graph itself.

    `rejects`: a scalar node; with `cfg.skip_nonfinite`, a step where it is not 0 is
    skipped and counted as a step with a NaN gradient is (e.g. labels outside the classes).
    """
    e = Emitter(g)
    frozen = frozen_names(g, cfg.freeze)
    g.frozen = frozen
    trainable = {n: i for n, i in g.params.items() if n not in frozen}
    if not trainable:
        raise ValueError("every parameter is frozen: nothing to train")
    grads = gradients(e, loss, list(trainable.values()))
    if cfg.clip_norm is not None:
        grads = _clip(e, grads, cfg.clip_norm)
    g.arenas = layout({n: g.nodes[i].size for n, i in trainable.items() if i in grads}, options)
    ok = _all_finite(e, loss, grads, [[trainable[n] for n in chunk] for chunk in g.arenas], rejects) \
        if cfg.skip_nonfinite else e.const(1.0)
    lr = e.leaf("state", "optimizer.lr", (), "f32", np.float32(cfg.lr))
    guarded = set()  # assigns that keep their old value when ok is 0 by themselves
    if cfg.optimizer == "sgd":
        _sgd(e, trainable, grads, lr, cfg)
    else:
        guarded = _adamw(e, trainable, grads, lr, cfg, ok)
    if cfg.skip_nonfinite:
        _reject_nonfinite(e, ok, guarded)
    return g


def train_mode(forward: Graph, momentum_default: float = 0.1) -> Graph:
    """A copy of the forward graph as it runs in training: batch norms normalise with the
    batch's statistics and update their running statistics (as torch's train() mode)."""
    from dataclasses import replace

    from .graph import make_attrs

    g = forward.copy()
    e = Emitter(g)
    updates = {}
    for i, n in enumerate(list(g.nodes)):
        if n.op != "batch_norm" or n.attr("training"):
            continue
        g.nodes[i] = replace(n, attrs=make_attrs(**{**dict(n.attrs), "training": True}))
        x, _, _, rm, rv = n.inputs
        channels = g.nodes[x].shape[1]
        mom = n.attr("momentum", momentum_default)
        _, count, mean, _, squares = batch_statistics(e, x)  # the normalisation's own nodes
        mean = e.reshape(mean, (channels,))
        var = e.reshape(e.scale(squares, 1.0 / max(count - 1, 1)), (channels,))  # unbiased, as torch
        for leaf, stat in ((rm, mean), (rv, var)):  # running = (1 - momentum) running + momentum batch
            name = g.nodes[leaf].attr("name")
            if g.nodes[leaf].op == "param":
                g.frozen.add(name)
                updates[name] = e.op("add", e.scale(leaf, 1 - mom), e.scale(stat, mom))
    g.assigns.update(updates)
    return g


def _only_output(g: Graph) -> str:
    if len(g.outputs) != 1:
        raise ValueError(f"the model has outputs {sorted(g.outputs)}: say which one the loss reads")
    return next(iter(g.outputs))


def _clip(e, grads, max_norm):
    total = None
    for gid in grads.values():
        sq = e.op("reduce_sum", e.op("mul", gid, gid), axes=tuple(range(len(e.shape(gid)))), keepdims=False)
        total = sq if total is None else e.op("add", total, sq)
    norm = e.op("sqrt", total)
    # scale = min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_
    scale = e.op("div", e.const(max_norm), e.op("add", norm, e.const(1e-6)))
    scale = e.op("sub", e.const(1.0), e.op("relu", e.op("sub", e.const(1.0), scale)))
    return {k: e.op("mul", gid, scale) for k, gid in grads.items()}


def _all_finite(e, loss, grads, chunks, rejects=None):
    """1 when the loss and every gradient are finite (and `rejects` is 0), else 0: computed
    on the GPU by one count over all of them (codegen splits it into passes within the
    binding limit; the gradients of an arena group, in its order here, are read as ranges
    of their arena)."""
    order = [p for chunk in chunks for p in chunk]
    order += [p for p in grads if p not in set(order)]
    count = e.op("count_nonfinite", loss, *[grads[p] for p in order])
    if rejects is not None:
        count = e.op("add", count, rejects)
    return e.op("eq", count, e.const(0.0))


def _reject_nonfinite(e, ok, guarded):
    """Gate every assign on `ok` (the loss and all gradients finite): a bad batch leaves
    weights, optimizer and norm statistics as they were, and counts itself in the state
    "optimizer.skipped_steps". Assigns in `guarded` select their old value themselves."""
    g = e.g
    params = g.params  # (a property that walks the graph: once)
    for name, new in list(g.assigns.items()):
        if name in guarded:
            continue
        old = params[name] if name in params else g.named[("state", name)]
        g.assigns[name] = e.op("where", ok, new, old)
    skipped = e.leaf("state", "optimizer.skipped_steps", (), "f32")
    g.assigns["optimizer.skipped_steps"] = e.op("add", skipped, e.op("sub", e.const(1.0), ok))


def _sgd(e, params, grads, lr, cfg):
    wd = cfg.weight_decay or 0.0
    for name, p in params.items():
        gr = grads.get(p)
        if gr is None:
            continue
        if wd:
            gr = e.op("add", gr, e.scale(p, wd))
        if cfg.momentum:
            buf = e.leaf("state", f"optimizer.{name}.momentum", e.shape(p))
            gr = e.op("add", e.scale(buf, cfg.momentum), gr)
            e.g.assigns[f"optimizer.{name}.momentum"] = gr
        e.g.assigns[name] = e.op("sub", p, e.op("mul", gr, lr))


def _adamw(e, params, grads, lr, cfg, ok):
    """AdamW as torch.optim.AdamW (decoupled weight decay); returns the assigns it made,
    which keep their old values when `ok` is 0."""
    b1, b2 = cfg.betas
    wd = 0.01 if cfg.weight_decay is None else cfg.weight_decay
    step = e.leaf("state", "optimizer.step", (), "f32")
    t = e.op("add", step, e.const(1.0))
    e.g.assigns["optimizer.step"] = t
    # bias corrections 1 - beta^t = -expm1(t log beta), computed on the GPU from the step counter
    c1 = e.op("neg", e.op("expm1", e.scale(t, math.log(b1))))
    c2 = e.op("neg", e.op("expm1", e.scale(t, math.log(b2))))
    step_size = e.op("div", lr, c1)
    sqrt_c2 = e.op("sqrt", c2)
    decay = e.op("sub", e.const(1.0), e.scale(lr, wd))
    guarded = set()
    for name, p in params.items():
        gr = grads.get(p)
        if gr is None:
            continue
        m = e.leaf("state", f"optimizer.{name}.exp_avg", e.shape(p))
        v = e.leaf("state", f"optimizer.{name}.exp_avg_sq", e.shape(p))
        m2 = e.op("moving_average", m, gr, ok, keep=b1, take=1 - b1)
        v2 = e.op("moving_average", v, e.op("mul", gr, gr), ok, keep=b2, take=1 - b2)
        new = e.op("adamw_update", p, m2, v2, step_size, sqrt_c2, decay, ok, eps=cfg.eps)
        for key, value in ((name, new), (f"optimizer.{name}.exp_avg", m2), (f"optimizer.{name}.exp_avg_sq", v2)):
            e.g.assigns[key] = value
            guarded.add(key)
    return guarded

"""Op conformance: every op, forward and backward, on full tensors, three ways.

For each case the graph is   out = op(inputs);  loss = sum(out * ct);  grads = d loss / d inputs
(ct is a random cotangent input of out's shape), and its outputs out, grad_0, grad_1, ... are
computed by
  (a) the GPU (compile_graph + Session, on whatever adapter wgpu finds: lavapipe in CI),
  (b) the float64 reference interpreter,
  (c) torch CPU autograd in float64,
all on the same inputs (rounded to float32 first, so every path sees the same numbers).
Errors are relative to the whole tensor: max|x - ref| / max|ref|. The interpreter must
match torch to 1e-9, the GPU (float32) to 1e-4. Shapes are odd on purpose (7x13, 3x5x17,
130x70x100 ...) so that no size is a multiple of a tile or a workgroup, and broadcasting
runs in both directions.

Non-differentiable ops (eq, step, cast, one_hot, nonfinite, count_nonfinite) get forward-only
checks against numpy; the gradient helper ops (gelu_grad, silu_grad, conv2d_weight_grad,
max/avg_pool2d_grad, scatter_add) against torch autograd of the op they differentiate; the
optimizer rows (moving_average, adamw_update) against torch.optim.AdamW.

The cases live in op_cases.py, op_cases_nn.py and op_cases_optim.py; test_op_table.py reads CASES and FWD_CASES
here and fails when an op of the table has no case.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from meganeura.compiler.ir.autodiff import gradients
from meganeura.compiler.ir.builder import Builder
from meganeura.compiler.ir.interpret import run_graph

import op_cases_nn  # noqa: F401  (adds the layer cases to the lists)
import op_cases_index  # noqa: F401  (adds the indexed-write cases)
import op_cases_optim  # noqa: F401  (adds the optimizer cases)
import op_cases_int  # noqa: F401  (adds the integer and index cases)
import op_cases_formats  # noqa: F401  (adds the narrow number format cases)
import op_cases_math  # noqa: F401  (adds the elementary-function, power and remainder cases)
from op_cases import CASES, FWD_CASES, TINY, Case, _rng, normal

INTERP_TOL = 1e-9  # float64 interpreter vs torch float64
GPU_TOL = 1e-4  # float32 GPU vs torch float64


# ------------------------------------------------------------------ machinery
def _dtype(v):
    return "i32" if v.dtype.kind in "iu" else "f32"


def build_case(case: Case):
    """(graph, inputs with the cotangent 'ct', names of the gradient outputs)."""
    b = Builder()
    t = {k: b.input(k, v.shape, _dtype(v)) for k, v in case.inputs.items()}
    out = case.build(b, t)
    ct = b.input("ct", out.shape)
    loss = b.sum(out * ct) if out.shape else out * ct
    grads = gradients(b.e, loss.id, [t[k].id for k in case.wrt])
    b.output("out", out)
    for n, k in enumerate(case.wrt):
        assert t[k].id in grads, f"{case.id}: autodiff gave no gradient for input {k!r}"
        b.g.outputs[f"grad_{n}"] = grads[t[k].id]
    inputs = dict(case.inputs)
    inputs["ct"] = normal(_rng(case.id + "/ct"), out.shape)
    return b.g, inputs


def torch_reference(case: Case, inputs: dict) -> dict:
    t = {}
    for k, v in inputs.items():
        if v.dtype.kind in "iu":
            t[k] = torch.tensor(v.astype(np.int64))
        else:
            t[k] = torch.tensor(v, dtype=torch.float64, requires_grad=k in case.wrt)
    ct = t.pop("ct")
    out = case.torch_fn(t)
    grads = torch.autograd.grad((out * ct).sum(), [t[k] for k in case.wrt])
    res = {"out": out.detach().numpy()}
    res.update({f"grad_{n}": g.numpy() for n, g in enumerate(grads)})
    return res


def rel_err(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    if x.shape != ref.shape:
        return math.inf
    if not np.isfinite(x).all():
        return math.inf
    if ref.size == 0:
        return 0.0
    return float(np.abs(x - ref).max() / max(np.abs(ref).max(), TINY))


def _op_in_graph(graph, op):
    return any(n.op == op for n in graph.nodes)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_forward_backward(case, run_on_gpu):
    graph, inputs = build_case(case)
    assert _op_in_graph(graph, case.op), f"{case.id}: the graph holds no {case.op} node"
    ref = torch_reference(case, inputs)
    interp, _ = run_graph(graph, inputs, np.float64)
    gpu = run_on_gpu(graph, inputs)
    assert set(interp) == set(ref) == set(gpu), (sorted(interp), sorted(ref), sorted(gpu))
    problems = []
    for name in sorted(ref):
        shape = np.shape(ref[name])
        for who, val, tol in (("interpreter", interp[name], INTERP_TOL), ("gpu", gpu[name], GPU_TOL)):
            if np.shape(val) != shape:
                problems.append(f"{name}: {who} shape {np.shape(val)} != torch {shape}")
                continue
            err = rel_err(val, ref[name])
            if not err <= tol:
                problems.append(f"{name}: {who} relative error {err:.3g} > {tol:g}")
    assert not problems, f"{case.id}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("case", FWD_CASES, ids=[c.id for c in FWD_CASES])
def test_forward_only(case, run_on_gpu):
    b = Builder()
    t = {k: b.input(k, v.shape, _dtype(v)) for k, v in case.inputs.items()}
    out = case.build(b, t)
    b.output("out", out)
    assert _op_in_graph(b.g, case.op), f"{case.id}: the graph holds no {case.op} node"
    ref = np.asarray(case.reference(case.inputs))
    interp = run_graph(b.g, case.inputs, np.float64)[0]["out"]
    gpu = run_on_gpu(b.g, case.inputs)["out"]
    assert interp.shape == ref.shape and gpu.shape == ref.shape, (interp.shape, gpu.shape, ref.shape)
    if case.exact:
        assert gpu.dtype == (np.int32 if out.dtype == "i32" else np.float32)
        np.testing.assert_array_equal(interp, ref)
        np.testing.assert_array_equal(gpu, ref)
    else:
        assert rel_err(interp, ref) <= INTERP_TOL, rel_err(interp, ref)
        assert rel_err(gpu, ref) <= GPU_TOL, rel_err(gpu, ref)


def test_case_ids_unique():
    ids = [c.id for c in CASES] + [c.id for c in FWD_CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)

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

Non-differentiable ops (eq, step, cast, one_hot) get forward-only checks against numpy;
the gradient helper ops (gelu_grad, silu_grad, conv2d_weight_grad, max/avg_pool2d_grad,
scatter_add) against torch autograd of the op they differentiate.

CASES and FWD_CASES are imported by test_op_table.py, which fails when an op of the table
has no case here.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from meganeura.compiler.autodiff import gradients
from meganeura.compiler.builder import Builder
from meganeura.compiler.interpret import run_graph

INTERP_TOL = 1e-9  # float64 interpreter vs torch float64
GPU_TOL = 1e-4  # float32 GPU vs torch float64
TINY = 1e-30


# ------------------------------------------------------------------ cases
@dataclass(frozen=True)
class Case:
    """out = build(builder, tensors); torch_fn(torch tensors) computes the same."""
    id: str
    op: str  # the op-table row this case covers (it must appear in the graph)
    inputs: dict  # name -> ndarray (float64 holding float32 values, or int32)
    build: Callable
    torch_fn: Callable
    wrt: tuple = ("a", "b")  # inputs differentiated, in grad_0, grad_1 ... order


@dataclass(frozen=True)
class FwdCase:
    """Forward only: out = build(builder, tensors); reference(numpy inputs) -> ndarray."""
    id: str
    op: str
    inputs: dict
    build: Callable
    reference: Callable
    exact: bool = True  # discrete outputs must match bit for bit
    extra: dict = field(default_factory=dict)


CASES: list = []
FWD_CASES: list = []


def _rng(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


def f32(x):
    """float64 array holding float32-representable values."""
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def normal(rng, shape, scale=1.0):
    return f32(rng.standard_normal(shape) * scale)


def uniform(rng, lo, hi, shape):
    return f32(rng.uniform(lo, hi, shape))


def signed(rng, lo, hi, shape):
    """Random sign times a magnitude in [lo, hi): keeps away from zero."""
    return f32(rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], shape))


def with_values(x, values):
    """x with its first elements replaced by `values` (extreme points of a domain).

    Scalars stay as drawn: the error is relative to the whole tensor, and a lone extreme
    point would be judged by itself (sigmoid'(30) is 1e-13, below float32's reach)."""
    x = np.array(x, dtype=np.float64)
    if x.size < 2 * len(values):
        return f32(x)
    flat = x.reshape(-1)
    k = min(len(values), flat.size)
    flat[:k] = values[:k]
    return f32(x)


def _sh(s):
    return "x".join(map(str, s)) if s else "scalar"


def add_case(id, op, inputs, build, torch_fn, wrt=None):
    if wrt is None:
        wrt = tuple(k for k, v in inputs.items() if v.dtype.kind == "f" and k != "mask")
    CASES.append(Case(id, op, inputs, build, torch_fn, tuple(wrt)))


# --- binary elementwise, with broadcasting both ways and scalars
BIN_SHAPES = [((7, 13), (7, 13)), ((5, 1), (1, 6)), ((6,), (4, 6)), ((4, 6), ()),
              ((), (3, 5, 17)), ((3, 1, 17), (5, 1))]
BINARY = {
    "add": (lambda b, x, y: x + y, lambda x, y: x + y),
    "sub": (lambda b, x, y: x - y, lambda x, y: x - y),
    "mul": (lambda b, x, y: x * y, lambda x, y: x * y),
    "div": (lambda b, x, y: x / y, lambda x, y: x / y),
    "maximum": (lambda b, x, y: b.maximum(x, y), torch.maximum),
}
for _op, (_b, _t) in BINARY.items():
    for _sa, _sb in BIN_SHAPES:
        _id = f"{_op}-{_sh(_sa)}-{_sh(_sb)}"
        _r = _rng(_id)
        _a = normal(_r, _sa)
        _y = signed(_r, 0.5, 2.0, _sb) if _op == "div" else normal(_r, _sb)
        add_case(_id, _op, {"a": _a, "b": _y},
                 lambda b, t, _b=_b: _b(b, t["a"], t["b"]),
                 lambda t, _t=_t: _t(t["a"], t["b"]))

# --- unary elementwise
SQRT2PI = math.sqrt(2 / math.pi)


def _unary(name, op, domain, build, torch_fn, shapes=((7, 13), (3, 5, 17), ())):
    for s in shapes:
        _id = f"{name}-{_sh(s)}"
        add_case(_id, op, {"a": domain(_rng(_id), s)}, build, torch_fn)


_unary("neg", "neg", normal, lambda b, t: -t["a"], lambda t: -t["a"])
_unary("exp", "exp", lambda r, s: uniform(r, -5, 5, s), lambda b, t: b.exp(t["a"]), lambda t: torch.exp(t["a"]))
_unary("log", "log", lambda r, s: uniform(r, 0.05, 20, s), lambda b, t: b.log(t["a"]), lambda t: torch.log(t["a"]))
_unary("sqrt", "sqrt", lambda r, s: uniform(r, 0.05, 20, s), lambda b, t: b.sqrt(t["a"]),
       lambda t: torch.sqrt(t["a"]))
_unary("relu", "relu", normal, lambda b, t: b.relu(t["a"]), lambda t: torch.relu(t["a"]))
_unary("sigmoid", "sigmoid", lambda r, s: with_values(normal(r, s, 3.0), [30, -30, 20, -20, 8.5, -8.5, 0.0]),
       lambda b, t: b.sigmoid(t["a"]), lambda t: torch.sigmoid(t["a"]))
_unary("tanh", "tanh", lambda r, s: with_values(normal(r, s, 2.0),
                                                 [20, -20, 1e-4, -1e-4, 0.003, -0.0049, 0.0051, 9.0, 0.0]),
       lambda b, t: b.tanh(t["a"]), lambda t: torch.tanh(t["a"]))
# all-small tensors: the whole-tensor error is then the error of the small values themselves
_unary("tanh_tiny", "tanh", lambda r, s: signed(r, 1e-5, 1e-3, s), lambda b, t: b.tanh(t["a"]),
       lambda t: torch.tanh(t["a"]), shapes=((5, 7),))
_unary("tanh_near_switch", "tanh", lambda r, s: signed(r, 0.003, 0.05, s), lambda b, t: b.tanh(t["a"]),
       lambda t: torch.tanh(t["a"]), shapes=((5, 7),))
_unary("erf", "erf", lambda r, s: with_values(normal(r, s, 2.0), [0.1, -0.45, 0.499, 0.501, 3.5, -5.0, 0.0]),
       lambda b, t: b.erf(t["a"]), lambda t: torch.erf(t["a"]))
_unary("erf_small", "erf", lambda r, s: signed(r, 1e-3, 0.5, s), lambda b, t: b.erf(t["a"]),
       lambda t: torch.erf(t["a"]), shapes=((5, 7),))
_unary("erf_large", "erf", lambda r, s: signed(r, 3.0, 5.0, s), lambda b, t: b.erf(t["a"]),
       lambda t: torch.erf(t["a"]), shapes=((5, 7),))
for _ap in ("none", "tanh"):
    _unary(f"gelu_{_ap}", "gelu", lambda r, s: with_values(normal(r, s, 3.0), [10, -10, 1e-4, -6.0, 0.0]),
           lambda b, t, _ap=_ap: b.gelu(t["a"], approximate=_ap),
           lambda t, _ap=_ap: F.gelu(t["a"], approximate=_ap))

# --- pow: any exponent on positive bases, integer exponents on negative ones too
for _c in (2.0, 3.0, 0.5, -1.0, 2.5, 1.0, 0.0, -0.5):
    _unary(f"pow{_c:g}_pos", "pow", lambda r, s: uniform(r, 0.2, 3.0, s),
           lambda b, t, _c=_c: b.pow(t["a"], _c), lambda t, _c=_c: torch.pow(t["a"], _c),
           shapes=((7, 13),))
for _c in (2.0, 3.0, -1.0, -2.0):
    _unary(f"pow{_c:g}_neg", "pow", lambda r, s: signed(r, 0.3, 2.0, s),
           lambda b, t, _c=_c: b.pow(t["a"], _c), lambda t, _c=_c: torch.pow(t["a"], _c),
           shapes=((3, 5, 17),))

# --- views and data movement
for _s, _to in (((3, 5, 17), (15, 17)), ((7, 13), (91,)), ((4, 6), (2, 3, 4))):
    _id = f"reshape-{_sh(_s)}-{_sh(_to)}"
    add_case(_id, "reshape", {"a": normal(_rng(_id), _s)},
             lambda b, t, _to=_to: b.reshape(t["a"], _to), lambda t, _to=_to: t["a"].reshape(_to))
# a reshape of a computed value (a view of a kernel's output), then more work on it
_id = "reshape-of-computed-3x5x17"
add_case(_id, "reshape", {"a": normal(_rng(_id), (3, 5, 17))},
         lambda b, t: b.exp(b.reshape(b.tanh(t["a"]), (15, 17))) * 2.0,
         lambda t: torch.exp(torch.tanh(t["a"]).reshape(15, 17)) * 2.0)

for _s, _p in (((3, 5, 17), (2, 0, 1)), ((3, 5, 17), (1, 2, 0)), ((3, 5, 17), (0, 2, 1)), ((7, 13), (1, 0)),
               ((2, 3, 5, 7), (3, 1, 0, 2))):
    _id = f"transpose-{_sh(_s)}-{''.join(map(str, _p))}"
    add_case(_id, "transpose", {"a": normal(_rng(_id), _s)},
             lambda b, t, _p=_p: b.op("transpose", t["a"], perm=_p), lambda t, _p=_p: t["a"].permute(*_p))
# a transpose feeding more elementwise work in the same kernel
_id = "transpose-fused-3x5x17"
add_case(_id, "transpose", {"a": normal(_rng(_id), (3, 5, 17)), "b": normal(_rng(_id + "b"), (17, 3, 5))},
         lambda b, t: b.op("transpose", b.exp(t["a"] * 0.5), perm=(2, 0, 1)) * t["b"],
         lambda t: torch.exp(t["a"] * 0.5).permute(2, 0, 1) * t["b"])

for _s, _to in (((5, 1), (5, 6)), ((6,), (4, 6)), ((), (3, 5)), ((3, 1, 17), (2, 3, 4, 17))):
    _id = f"broadcast_to-{_sh(_s)}-{_sh(_to)}"
    add_case(_id, "broadcast_to", {"a": normal(_rng(_id), _s)},
             lambda b, t, _to=_to: b.broadcast_to(t["a"], shape=_to),
             lambda t, _to=_to: torch.broadcast_to(t["a"], _to))

# --- reductions: single, several, non-adjacent axes; with and without keepdims
REDUCE_AXES = [((3, 5, 17), (2,)), ((3, 5, 17), (0,)), ((3, 5, 17), (1,)), ((3, 5, 17), (0, 1)),
               ((3, 5, 17), (1, 2)), ((3, 5, 17), (0, 2)), ((3, 5, 17), (0, 1, 2)), ((3, 5, 17), (-1,)),
               ((2, 3, 5, 7), (0, 2)), ((2, 3, 5, 7), (1, 3)), ((2, 3, 5, 7), (0, 3)),
               ((3, 300), (1,)), ((300, 3), (0,)), ((7, 13), (0, 1)), ((5, 1, 7), (1,))]
for _op, _bf, _tf in (("reduce_sum", "sum", lambda x, ax, kd: torch.sum(x, dim=ax, keepdim=kd)),
                      ("reduce_max", "max", lambda x, ax, kd: torch.amax(x, dim=ax, keepdim=kd))):
    for _s, _ax in REDUCE_AXES:
        for _kd in (True, False):
            _id = f"{_op}-{_sh(_s)}-ax{''.join(map(str, _ax))}-{'keep' if _kd else 'drop'}"
            add_case(_id, _op, {"a": normal(_rng(_id), _s)},  # continuous values: no ties for max
                     lambda b, t, _bf=_bf, _ax=_ax, _kd=_kd: getattr(b, _bf)(t["a"], _ax, _kd),
                     lambda t, _tf=_tf, _ax=_ax, _kd=_kd: _tf(t["a"], _ax, _kd))


_id = "reduce_sum-66000x3-ax1-drop"  # one workgroup per row, past 65535 rows: a 2-D grid
add_case(_id, "reduce_sum", {"a": normal(_rng(_id), (66000, 3))}, lambda b, t: b.sum(t["a"], (1,), False),
         lambda t: t["a"].sum(1))


# --- matmul: all transposes, edge tiles, several workgroups, batches that broadcast
def _mm_shapes(m, n, k, ta, tb, batch_a=(), batch_b=()):
    return batch_a + ((k, m) if ta else (m, k)), batch_b + ((n, k) if tb else (k, n))


def _torch_mm(a, b, ta, tb):
    return torch.matmul(a.transpose(-1, -2) if ta else a, b.transpose(-1, -2) if tb else b)


_MM = [(67, 45, 33, ta, tb, (), ()) for ta in (False, True) for tb in (False, True)]
_MM += [(130, 70, 100, False, False, (), ()), (130, 70, 100, True, True, (), ()),
        (19, 23, 17, False, False, (1,), (4,)), (19, 23, 17, True, False, (4,), (1,)),
        (19, 23, 17, False, True, (2, 3), (3,)), (19, 23, 17, False, False, (4,), ()),
        (1, 5, 3, False, False, (), ()), (65, 1, 70, False, True, (), ()), (7, 9, 1, False, False, (), ())]
for _m, _n, _k, _ta, _tb, _ba, _bb in _MM:
    _sa, _sb = _mm_shapes(_m, _n, _k, _ta, _tb, _ba, _bb)
    _id = f"matmul-{_sh(_sa)}{'T' if _ta else ''}-{_sh(_sb)}{'T' if _tb else ''}"
    _r = _rng(_id)
    add_case(_id, "matmul", {"a": normal(_r, _sa), "b": normal(_r, _sb)},
             lambda b, t, _ta=_ta, _tb=_tb: b.matmul(t["a"], t["b"], trans_a=_ta, trans_b=_tb),
             lambda t, _ta=_ta, _tb=_tb: _torch_mm(t["a"], t["b"], _ta, _tb))
_id = "matmul-matvec-67x33-33"
add_case(_id, "matmul", {"a": normal(_rng(_id), (67, 33)), "b": normal(_rng(_id + "b"), (33,))},
         lambda b, t: b.matmul(t["a"], t["b"]), lambda t: torch.matmul(t["a"], t["b"]))

# --- softmax and log_softmax: rows of 1, 7 and 300 columns; large logits
for _op, _tf in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
    for _s, _scale in (((5, 1), 1.0), ((6, 7), 1.0), ((3, 300), 3.0), ((2, 3, 7), 1.0), ((4, 9), 40.0)):
        _id = f"{_op}-{_sh(_s)}-s{_scale:g}"
        add_case(_id, _op, {"a": normal(_rng(_id), _s, _scale)},
                 lambda b, t, _op=_op: getattr(b, _op)(t["a"]), lambda t, _tf=_tf: _tf(t["a"], -1))
    # more rows than one dispatch dimension holds (65535 workgroups): the grid folds into 2-D
    _id = f"{_op}-66000x2"
    add_case(_id, _op, {"a": normal(_rng(_id), (66000, 2))},
             lambda b, t, _op=_op: getattr(b, _op)(t["a"]), lambda t, _tf=_tf: _tf(t["a"], -1))
    _id = f"{_op}-axis0-7x5"  # the builder transposes around the last-axis kernel
    add_case(_id, _op, {"a": normal(_rng(_id), (7, 5))},
             lambda b, t, _op=_op: getattr(b, _op)(t["a"], axis=0), lambda t, _tf=_tf: _tf(t["a"], 0))


# --- losses, against torch.nn.functional; gradients w.r.t. logits / prediction and target
def _ce_torch(t):
    per_row = F.cross_entropy(t["a"], t["labels"], reduction="none")
    if "mask" not in t:
        return per_row.mean()
    return (per_row * t["mask"]).sum() / torch.clamp(t["mask"].sum(), min=1.0)


def _mse_torch(t):
    if "mask" not in t:
        return F.mse_loss(t["a"], t["b"])
    d = F.mse_loss(t["a"], t["b"], reduction="none")
    rows = d.shape[0]
    per_row = d.reshape(rows, -1).sum(1)
    return (per_row * t["mask"]).sum() / (torch.clamp(t["mask"].sum(), min=1.0) * (d.numel() // rows))


for _rows, _cls, _masked in ((9, 7, False), (9, 7, True), (5, 300, True), (13, 1, False)):
    _id = f"cross_entropy-{_rows}x{_cls}-{'mask' if _masked else 'nomask'}"
    _r = _rng(_id)
    _ins = {"a": normal(_r, (_rows, _cls), 2.0), "labels": _r.integers(0, _cls, (_rows,)).astype(np.int32)}
    if _masked:
        _ins["mask"] = f32(np.arange(_rows) % 3 != 1)
    add_case(_id, "cross_entropy", _ins,
             lambda b, t: b.cross_entropy(t["a"], t["labels"], t.get("mask")), _ce_torch, wrt=("a",))

for _s, _masked in (((9, 7), False), ((9, 7), True), ((4, 3, 5), True), ((6,), False)):
    _id = f"mse-{_sh(_s)}-{'mask' if _masked else 'nomask'}"
    _r = _rng(_id)
    _ins = {"a": normal(_r, _s), "b": normal(_r, _s)}
    if _masked:
        _ins["mask"] = f32(np.arange(_s[0]) % 3 != 2)
    add_case(_id, "mse", _ins, lambda b, t: b.mse(t["a"], t["b"], t.get("mask")), _mse_torch)


# --- compositions: fused kernels that read one buffer at several offsets, views of kernel
# outputs, gradients that accumulate from several uses of one input
def _layernorm(b, x):
    mu = b.mean(x, -1, True)
    d = x - mu
    return d / b.sqrt(b.mean(d * d, -1, True) + 1e-5)


def _layernorm_t(x):
    return F.layer_norm(x, x.shape[-1:], eps=1e-5)


def _attention(b, t):
    s = b.matmul(t["a"], t["b"], trans_b=True) * (1 / math.sqrt(9))
    return b.matmul(b.softmax(s), t["v"])


def _attention_t(t):
    return torch.softmax(t["a"] @ t["b"].transpose(-1, -2) / 3.0, -1) @ t["v"]


def _pooled_matmul(b, t):
    """A matmul whose operands live in pooled buffers larger than themselves (the big
    temporaries die first), so an edge tile that read past K or N would see stale data
    instead of the zeros that a robust driver returns past a buffer's end."""
    s1 = b.sum(b.exp(t["c"] * 0.01), None, False) * 1e-5
    s2 = b.sum(b.exp(t["c"] * 0.02 + 1), None, False) * 1e-5
    return b.matmul(b.tanh(t["a"]) + s1, b.tanh(t["b"]) + s2)


def _pooled_matmul_t(t):
    s1 = torch.exp(t["c"] * 0.01).sum() * 1e-5
    s2 = torch.exp(t["c"] * 0.02 + 1).sum() * 1e-5
    return (torch.tanh(t["a"]) + s1) @ (torch.tanh(t["b"]) + s2)


_COMPOSITE = [
    ("compose-matmul-pooled-67x33x45", "matmul", {"a": (67, 33), "b": (33, 45), "c": (150, 150)},
     _pooled_matmul, _pooled_matmul_t),
    ("compose-a_plus_aT-9x9", "transpose", {"a": (9, 9)},
     lambda b, t: t["a"] + b.transpose(t["a"]) * t["a"], lambda t: t["a"] + t["a"].T * t["a"]),
    ("compose-a_aT-67x33", "matmul", {"a": (67, 33)},
     lambda b, t: b.matmul(t["a"], t["a"], trans_b=True), lambda t: t["a"] @ t["a"].T),
    ("compose-layernorm-6x37", "reduce_sum", {"a": (6, 37)}, lambda b, t: _layernorm(b, t["a"]),
     lambda t: _layernorm_t(t["a"])),
    ("compose-layernorm-2x3x70", "reduce_sum", {"a": (2, 3, 70)}, lambda b, t: _layernorm(b, t["a"]),
     lambda t: _layernorm_t(t["a"])),
    ("compose-attention-2x3x11x9", "softmax", {"a": (2, 3, 11, 9), "b": (2, 3, 13, 9), "v": (1, 3, 13, 5)},
     _attention, _attention_t),
    ("compose-mlp-9x13", "gelu", {"a": (9, 13), "b": (17, 13), "c": (17,)},
     lambda b, t: b.log_softmax(b.gelu(b.linear(t["a"], t["b"], t["c"]), approximate="tanh")),
     lambda t: torch.log_softmax(F.gelu(F.linear(t["a"], t["b"], t["c"]), approximate="tanh"), -1)),
    ("compose-reshape-max-4x6x5", "reduce_max", {"a": (4, 6, 5)},
     lambda b, t: b.max(b.reshape(b.exp(t["a"] * 0.3), (4, 3, 2, 5)), (1, 3), True) * b.reshape(
         b.sigmoid(b.sum(t["a"], (1, 2), False)), (4, 1, 1, 1)),
     lambda t: torch.amax(torch.exp(t["a"] * 0.3).reshape(4, 3, 2, 5), (1, 3), keepdim=True) * torch.sigmoid(
         t["a"].sum((1, 2))).reshape(4, 1, 1, 1)),
    ("compose-broadcast-chain-5x1-1x6", "broadcast_to", {"a": (5, 1), "b": (1, 6)},
     lambda b, t: b.broadcast_to(b.tanh(t["a"]), shape=(5, 6)) * b.exp(t["b"]) - t["a"] / (1 + t["b"] * t["b"]),
     lambda t: torch.tanh(t["a"]).expand(5, 6) * torch.exp(t["b"]) - t["a"] / (1 + t["b"] * t["b"])),
]
for _id, _op, _shapes, _b, _t in _COMPOSITE:
    _r = _rng(_id)
    add_case(_id, _op, {k: normal(_r, s) for k, s in _shapes.items()}, _b, _t)


# --- neural-network layers (compiler/ops_nn.py, compiler/ops_layers.py)
def _conv_t(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    top, left, bottom, right = padding
    return F.conv2d(F.pad(x, (left, right, top, bottom)), w, stride=stride, dilation=dilation, groups=groups)


def _convT_t(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, output_padding=(0, 0)):
    """Transposed convolution with ONNX-style (top, left, bottom, right) padding: the full
    output, extended by output_padding, then cropped."""
    top, left, bottom, right = padding
    full = F.conv_transpose2d(x, w, stride=stride, dilation=dilation, groups=groups)
    full = F.pad(full, (0, output_padding[1], 0, output_padding[0]))
    return full[:, :, top:full.shape[2] - bottom, left:full.shape[3] - right]


_CONV = [  # x shape, w shape, attrs
    ((2, 3, 11, 9), (5, 3, 3, 3), {"padding": (1, 1, 1, 1)}),
    ((2, 3, 11, 9), (4, 3, 3, 2), {"stride": (2, 3), "padding": (1, 0, 2, 1), "dilation": (2, 1)}),
    ((1, 6, 9, 7), (9, 2, 3, 3), {"stride": (2, 2), "padding": (0, 1, 1, 0), "groups": 3}),
    ((2, 5, 13, 17), (70, 5, 1, 1), {}),  # a 1x1 conv: M, N, K past one 64x64 tile
]
for _xs, _ws, _at in _CONV:
    _id = f"conv2d-{_sh(_xs)}-{_sh(_ws)}-" + "-".join(f"{k}{''.join(map(str, v)) if isinstance(v, tuple) else v}"
                                                   for k, v in sorted(_at.items()))
    _r = _rng(_id)
    add_case(_id.rstrip("-"), "conv2d", {"a": normal(_r, _xs), "b": normal(_r, _ws, 0.5)},
             lambda b, t, _at=_at: b.op("conv2d", t["a"], t["b"], **_at),
             lambda t, _at=_at: _conv_t(t["a"], t["b"], **_at))

_CONVT = [
    ((2, 4, 5, 6), (4, 3, 3, 3), {"stride": (2, 2), "padding": (1, 1, 1, 1), "output_padding": (1, 0)}),
    ((1, 6, 4, 5), (6, 2, 3, 2), {"stride": (1, 2), "padding": (0, 1, 2, 0), "groups": 3, "dilation": (2, 1)}),
]
for _xs, _ws, _at in _CONVT:
    _id = f"conv_transpose2d-{_sh(_xs)}-{_sh(_ws)}"
    _r = _rng(_id)
    add_case(_id, "conv_transpose2d", {"a": normal(_r, _xs), "b": normal(_r, _ws, 0.5)},
             lambda b, t, _at=_at: b.op("conv_transpose2d", t["a"], t["b"], **_at),
             lambda t, _at=_at: _convT_t(t["a"], t["b"], **_at))

_POOL = [  # x shape, attrs (symmetric padding, as torch takes it)
    ((2, 3, 7, 9), {"kernel": (2, 2)}),
    ((2, 3, 11, 8), {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1, 1, 1), "ceil_mode": True}),
    ((1, 2, 9, 10), {"kernel": (3, 2), "stride": (2, 1), "padding": (1, 0, 1, 0)}),
]


def _pool_t(fn, x, kernel, stride=None, padding=(0, 0, 0, 0), ceil_mode=False, **kw):
    return fn(x, kernel, stride or kernel, (padding[0], padding[1]), ceil_mode=ceil_mode, **kw)


for _xs, _at in _POOL:
    _id = f"max_pool2d-{_sh(_xs)}-k{''.join(map(str, _at['kernel']))}-{len(_at)}"
    add_case(_id, "max_pool2d", {"a": normal(_rng(_id), _xs)},  # continuous values: no ties in a window
             lambda b, t, _at=_at: b.op("max_pool2d", t["a"], **_at),
             lambda t, _at=_at: _pool_t(F.max_pool2d, t["a"], **_at))
    for _cip in (True, False):
        _id = f"avg_pool2d-{_sh(_xs)}-k{''.join(map(str, _at['kernel']))}-{len(_at)}-{'incl' if _cip else 'excl'}"
        add_case(_id, "avg_pool2d", {"a": normal(_rng(_id), _xs)},
                 lambda b, t, _at=_at, _cip=_cip: b.op("avg_pool2d", t["a"], **_at, count_include_pad=_cip),
                 lambda t, _at=_at, _cip=_cip: _pool_t(F.avg_pool2d, t["a"], **_at, count_include_pad=_cip))


def _index(starts, steps, shape):
    """torch advanced indices (np.ix_ style) for x[start + c * step] along every axis."""
    rank = len(shape)
    out = []
    for a, (s0, st, n) in enumerate(zip(starts, steps, shape)):
        view = [1] * rank
        view[a] = n
        out.append((torch.arange(n) * st + s0).reshape(view))
    return tuple(out)


_SLICES = [((7, 13), (1, 2), (2, 3), (3, 4)), ((3, 5, 17), (0, 4, 16), (1, -1, -2), (3, 5, 9)),
           ((3, 5, 17), (2, 1, 3), (1, 1, 1), (1, 3, 11))]
for _s, _st, _sp, _out in _SLICES:
    _id = f"slice-{_sh(_s)}-{_sh(_out)}-{'_'.join(map(str, _sp))}"
    add_case(_id, "slice", {"a": normal(_rng(_id), _s)},
             lambda b, t, _st=_st, _sp=_sp, _out=_out: b.op("slice", t["a"], starts=_st, steps=_sp, shape=_out),
             lambda t, _st=_st, _sp=_sp, _out=_out: t["a"][_index(_st, _sp, _out)])
for _s, _st, _sp, _out, _v in (((3, 4), (1, 2), (2, 3), (7, 13), 0.0),
                               ((3, 5, 9), (0, 4, 16), (1, -1, -2), (3, 5, 17), 1.5),
                               ((1, 3, 11), (2, 1, 3), (1, 1, 1), (3, 5, 17), -2.0)):
    _id = f"pad-{_sh(_s)}-{_sh(_out)}-v{_v:g}"

    def _pad_t(t, _st=_st, _sp=_sp, _out=_out, _v=_v):
        full = torch.full(_out, _v, dtype=torch.float64)
        return full.index_put(_index(_st, _sp, t["a"].shape), t["a"])

    add_case(_id, "pad", {"a": normal(_rng(_id), _s)},
             lambda b, t, _st=_st, _sp=_sp, _out=_out, _v=_v: b.op("pad", t["a"], starts=_st, steps=_sp, shape=_out,
                                                                   value=_v), _pad_t)

for _sc, _sa, _sb in (((7, 13), (7, 13), ()), ((5, 1), (1, 6), (5, 6)), ((4, 6), (6,), (4, 1))):
    _id = f"where-{_sh(_sc)}-{_sh(_sa)}-{_sh(_sb)}"
    _r = _rng(_id)
    _cond = with_values(_r.random(_sc) < 0.5, [1.0, 0.0])  # both branches taken
    add_case(_id, "where", {"cond": _cond, "a": normal(_r, _sa), "b": normal(_r, _sb)},
             lambda b, t: b.where(t["cond"], t["a"], t["b"]), lambda t: torch.where(t["cond"] != 0, t["a"], t["b"]),
             wrt=("a", "b"))

for _shapes, _ax in ((((3, 4), (3, 7), (3, 1)), 1), (((2, 3, 5), (1, 3, 5)), 0), (((2, 3, 5), (2, 3, 5)), -2)):
    _id = f"concat-{'-'.join(_sh(s) for s in _shapes)}-ax{_ax}"
    _r = _rng(_id)
    _names = ["a", "b", "c"][:len(_shapes)]
    add_case(_id, "concat", {k: normal(_r, s) for k, s in zip(_names, _shapes)},
             lambda b, t, _names=_names, _ax=_ax: b.concat(*[t[k] for k in _names], axis=_ax),
             lambda t, _names=_names, _ax=_ax: torch.cat([t[k] for k in _names], _ax))

for _rows, _inner, _idx in ((10, (7,), [[0, 3, 3, 9], [-1, 2, 0, 3], [5, 5, 5, 1]]), (70, (3, 5), [1, 69, -70, 1, 8])):
    _id = f"gather-{_rows}x{_sh(_inner)}-{_sh(np.shape(_idx))}"
    add_case(_id, "gather", {"a": normal(_rng(_id), (_rows,) + _inner), "idx": np.array(_idx, np.int32)},
             lambda b, t: b.gather(t["a"], t["idx"]), lambda t: t["a"][t["idx"]], wrt=("a",))

_unary("silu", "silu", lambda r, s: with_values(normal(r, s, 3.0), [30, -30, 1e-4, 0.0]),
       lambda b, t: b.silu(t["a"]), lambda t: F.silu(t["a"]))
_unary("softplus", "softplus", lambda r, s: with_values(normal(r, s, 5.0), [30, 20.5, 19.5, -30, 1e-4, 0.0]),
       lambda b, t: b.softplus(t["a"]), lambda t: F.softplus(t["a"]))
for _sa, _sb in (((7, 13), (7, 13)), ((5, 1), (1, 6))):
    _id = f"swiglu-{_sh(_sa)}-{_sh(_sb)}"
    _r = _rng(_id)
    add_case(_id, "swiglu", {"a": normal(_r, _sa, 2.0), "b": normal(_r, _sb)},
             lambda b, t: b.swiglu(t["a"], t["b"]), lambda t: F.silu(t["a"]) * t["b"])

for _s, _k, _affine in (((4, 7, 13), 1, True), ((3, 5, 70), 2, True), ((6, 37), 1, False)):
    _id = f"layer_norm-{_sh(_s)}-n{_k}-{'affine' if _affine else 'plain'}"
    _r = _rng(_id)
    _ins = {"a": normal(_r, _s, 2.0) + 0.5}
    if _affine:
        _ins.update(w=normal(_r, _s[-_k:]), b=normal(_r, _s[-_k:]))
    add_case(_id, "layer_norm", _ins,
             lambda b, t, _k=_k: b.layer_norm(*[t[k] for k in ("a", "w", "b") if k in t], normalized_ndim=_k,
                                              eps=1e-5),
             lambda t, _k=_k: F.layer_norm(t["a"], t["a"].shape[-_k:], t.get("w"), t.get("b"), eps=1e-5))
for _s, _k, _affine in (((4, 7, 13), 1, True), ((3, 70), 1, False), ((2, 3, 5, 6), 2, True)):
    _id = f"rms_norm-{_sh(_s)}-n{_k}-{'affine' if _affine else 'plain'}"
    _r = _rng(_id)
    _ins = {"a": normal(_r, _s, 2.0)}
    if _affine:
        _ins["w"] = normal(_r, _s[-_k:])
    add_case(_id, "rms_norm", _ins,
             lambda b, t, _k=_k: b.rms_norm(*[t[k] for k in ("a", "w") if k in t], normalized_ndim=_k, eps=1e-6),
             lambda t, _k=_k: F.rms_norm(t["a"], t["a"].shape[-_k:], t.get("w"), eps=1e-6))
for _s, _g, _affine in (((2, 6, 5, 7), 3, True), ((3, 4, 11), 2, False), ((2, 6, 5, 7), 6, True)):
    _id = f"group_norm-{_sh(_s)}-g{_g}-{'affine' if _affine else 'plain'}"
    _r = _rng(_id)
    _ins = {"a": normal(_r, _s, 2.0) - 0.5}
    if _affine:
        _ins.update(w=normal(_r, _s[1:2]), b=normal(_r, _s[1:2]))
    add_case(_id, "group_norm", _ins,
             lambda b, t, _g=_g: b.group_norm(*[t[k] for k in ("a", "w", "b") if k in t], groups=_g, eps=1e-5),
             lambda t, _g=_g: F.group_norm(t["a"], _g, t.get("w"), t.get("b"), eps=1e-5))
def _batch_norm_t(t, training):
    if training:  # batch statistics (torch updates copies of the running ones)
        return F.batch_norm(t["a"], t["rm"].detach().clone(), t["rv"].detach().clone(), t["w"], t["b"],
                            training=True, eps=1e-5)
    shape = (1, -1) + (1,) * (t["a"].dim() - 2)
    return ((t["a"] - t["rm"].reshape(shape)) / torch.sqrt(t["rv"].reshape(shape) + 1e-5) * t["w"].reshape(shape)
            + t["b"].reshape(shape))


for _s, _train in (((4, 6, 5, 7), True), ((4, 6, 5, 7), False), ((9, 5), True)):
    _id = f"batch_norm-{_sh(_s)}-{'train' if _train else 'eval'}"
    _r = _rng(_id)
    _c = _s[1]
    add_case(_id, "batch_norm", {"a": normal(_r, _s, 2.0) + 1.0, "w": normal(_r, (_c,)), "b": normal(_r, (_c,)),
                                 "rm": normal(_r, (_c,)), "rv": uniform(_r, 0.5, 2.0, (_c,))},
             lambda b, t, _train=_train: b.batch_norm(t["a"], t["w"], t["b"], t["rm"], t["rv"], training=_train,
                                                      eps=1e-5),
             lambda t, _train=_train: _batch_norm_t(t, _train),
             wrt=("a", "w", "b") if _train else ("a", "w", "b", "rm", "rv"))


def _attention_torch(t, causal=False, scale=None):
    q, k, v = t["a"], t["b"], t["v"]
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:  # query i sees keys up to i + (t - s): aligned at the bottom right
        sq, tk = q.shape[2], k.shape[2]
        allowed = torch.arange(tk)[None, :] <= torch.arange(sq)[:, None] + (tk - sq)
        s = s.masked_fill(~allowed, -math.inf)
    if "mask" in t:
        s = s + t["mask"]
    return torch.softmax(s, -1) @ v


_ATTN = [  # q, k, v shapes, mask shape or None, attrs
    ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 6), None, {}),
    ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 6), None, {"causal": True}),  # grouped-query heads
    ((1, 6, 9, 4), (1, 3, 9, 4), (1, 3, 9, 5), (1, 1, 9, 9), {"scale": 0.3}),
    ((2, 2, 3, 5), (2, 1, 6, 5), (2, 1, 6, 3), (2, 2, 3, 6), {"causal": True}),
]
for _q, _k, _v, _m, _at in _ATTN:
    _id = f"attention-{_sh(_q)}-{_sh(_k)}-{_sh(_v)}" + (f"-mask{_sh(_m)}" if _m else "") + "".join(
        f"-{k}" for k in sorted(_at))
    _r = _rng(_id)
    _ins = {"a": normal(_r, _q), "b": normal(_r, _k), "v": normal(_r, _v)}
    if _m:
        _ins["mask"] = normal(_r, _m)
    add_case(_id, "attention", _ins,
             lambda b, t, _at=_at: b.attention(*[t[k] for k in ("a", "b", "v", "mask") if k in t], **_at),
             lambda t, _at=_at: _attention_torch(t, **_at), wrt=("a", "b", "v"))


def _scores_t(t, causal=False, scale=None):
    q, k = t["a"], t["b"]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:
        sq, tk = q.shape[2], k.shape[2]
        s = s.masked_fill(~(torch.arange(tk)[None, :] <= torch.arange(sq)[:, None] + (tk - sq)), -math.inf)
    return s


def _attention_grad_t(t, wrt, **at):
    """attention's gradient w.r.t. q, k or v (create_graph: the case differentiates it again)."""
    x = [t["a"], t["b"], t["v"]]
    if not x[wrt].requires_grad:  # v, when the case does not differentiate dV by it (no part in it)
        x[wrt] = x[wrt].detach().requires_grad_()
    o = _attention_torch(dict(zip("abv", x)), **at)
    return torch.autograd.grad(o, x[wrt], t["do"], create_graph=True)[0]


# the fused backward's rows: the forward's log-sum-exp, and the gradient itself (its own
# gradient, second order, differentiates attention's decomposition); o and lse are inputs
# that the kernel trusts, so they are made from q, k, v here
for _q, _k, _v, _at in (((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), {"causal": True}),
                        ((1, 3, 9, 4), (1, 3, 9, 4), (1, 3, 9, 4), {"scale": 0.3})):
    _id = f"attention_lse-{_sh(_q)}-{_sh(_k)}" + "".join(f"-{k}" for k in sorted(_at))
    _r = _rng(_id)
    add_case(_id, "attention_lse", {"a": normal(_r, _q), "b": normal(_r, _k), "v": normal(_r, _v)},
             lambda b, t, _at=_at: b.op("attention_lse", t["a"], t["b"], t["v"], **_at),
             lambda t, _at=_at: torch.logsumexp(_scores_t(t, **_at), -1), wrt=("a", "b"))
for _w, (_q, _k, _v, _at) in enumerate((((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), {"causal": True}),
                                        ((1, 2, 6, 4), (1, 1, 6, 4), (1, 1, 6, 4), {"scale": 0.3}),
                                        ((2, 2, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8), {"causal": True}))):
    _id = f"attention_grad-wrt{_w}-{_sh(_q)}-{_sh(_k)}" + "".join(f"-{k}" for k in sorted(_at))
    _r = _rng(_id)
    _ins = {"a": normal(_r, _q), "b": normal(_r, _k), "v": normal(_r, _v), "do": normal(_r, _q)}
    _tt = {k: torch.tensor(x) for k, x in _ins.items()}
    _ins["o"] = f32(_attention_torch(_tt, **_at).numpy())
    _ins["lse"] = f32(torch.logsumexp(_scores_t(_tt, **_at), -1).numpy())
    add_case(_id, "attention_grad", _ins,
             lambda b, t, _w=_w, _at=_at: b.op("attention_grad", *[t[k] for k in ("a", "b", "v", "o", "do", "lse")],
                                               wrt=_w, **_at),
             lambda t, _w=_w, _at=_at: _attention_grad_t(t, _w, **_at),
             wrt=("a", "b", "do") if _w == 2 else ("a", "b", "v", "do"))  # dV = P^T dO: v plays no part


def _rope_t(t):
    x = t["a"]
    h = x.shape[-1] // 2
    return x * t["b"] + torch.cat([-x[..., h:], x[..., :h]], -1) * t["c"]


for _xs, _cs in (((2, 3, 5, 8), (5, 8)), ((1, 2, 7, 6), (1, 1, 7, 6))):
    _id = f"rope-{_sh(_xs)}-{_sh(_cs)}"
    _r = _rng(_id)
    _ang = _r.uniform(0, 6.3, _cs)
    add_case(_id, "rope", {"a": normal(_r, _xs), "b": f32(np.cos(_ang)), "c": f32(np.sin(_ang))},
             lambda b, t: b.rope(t["a"], t["b"], t["c"]), _rope_t)

_RESIZE = [  # x shape, output size, our attrs, torch interpolate kwargs
    ((2, 3, 5, 7), (9, 4), {"mode": "linear", "transform": "pytorch_half_pixel"},
     {"mode": "bilinear", "align_corners": False}),
    ((1, 2, 5, 7), (9, 13), {"mode": "linear", "transform": "align_corners"},
     {"mode": "bilinear", "align_corners": True}),
    ((2, 2, 5, 7), (8, 11), {"mode": "cubic", "transform": "half_pixel", "cubic_a": -0.75},
     {"mode": "bicubic", "align_corners": False}),
    ((2, 3, 5, 7), (9, 4), {"mode": "nearest", "transform": "asymmetric", "nearest_mode": "floor"},
     {"mode": "nearest"}),
]
for _xs, _size, _at, _tk in _RESIZE:
    _id = f"resize-{_at['mode']}-{_at['transform']}-{_sh(_xs)}-{_sh(_size)}"
    add_case(_id, "resize", {"a": normal(_rng(_id), _xs)},
             lambda b, t, _size=_size, _at=_at: b.resize(t["a"], size=_size, **_at),
             lambda t, _size=_size, _tk=_tk: F.interpolate(t["a"], size=_size, **_tk))


# --- forward-only ops
def _fwd(id, op, inputs, build, reference, exact=True):
    FWD_CASES.append(FwdCase(id, op, inputs, build, reference, exact))


_r = _rng("eq")
_x = normal(_r, (5, 6))
_y = np.where(_r.random((5, 6)) < 0.4, _x, normal(_r, (5, 6)))
_fwd("eq-5x6-5x6", "eq", {"a": _x, "b": _y}, lambda b, t: b.eq(t["a"], t["b"]),
     lambda v: (v["a"] == v["b"]).astype(np.float32))
_x = f32(_r.integers(-2, 3, (5, 1)))
_y = f32(_r.integers(-2, 3, (1, 6)))
_fwd("eq-5x1-1x6", "eq", {"a": _x, "b": _y}, lambda b, t: b.eq(t["a"], t["b"]),
     lambda v: (v["a"] == v["b"]).astype(np.float32))
_fwd("eq-i32-7-scalar", "eq", {"a": _r.integers(0, 4, (7,)).astype(np.int32), "b": np.array(2, np.int32)},
     lambda b, t: b.eq(t["a"], t["b"]), lambda v: (v["a"] == v["b"]).astype(np.float32))
_fwd("step-3x5x17", "step", {"a": with_values(normal(_rng("step"), (3, 5, 17)), [0.0, -0.0, 1e-30, -1e-30])},
     lambda b, t: b.step(t["a"]), lambda v: (v["a"] > 0).astype(np.float32))
_fwd("nonfinite-4x9", "nonfinite",
     {"a": with_values(normal(_rng("nonfinite"), (4, 9), 1e30), [np.nan, np.inf, -np.inf, 1.7e38, -0.0, 1e-45])},
     lambda b, t: b.nonfinite(t["a"] * 2.0), lambda v: (~np.isfinite(v["a"] * 2.0)).astype(np.float32))
_fwd("cast-f32-i32-7x13", "cast", {"a": with_values(normal(_rng("cast"), (7, 13), 5.0), [2.7, -2.7, 0.5, -0.5])},
     lambda b, t: b.cast(t["a"], to="i32"), lambda v: np.trunc(v["a"]).astype(np.int32))
_fwd("cast-i32-f32-7x13", "cast", {"a": _rng("cast2").integers(-1000, 1000, (7, 13)).astype(np.int32)},
     lambda b, t: b.cast(t["a"], to="f32") * 0.5, lambda v: v["a"].astype(np.float64) * 0.5)
_fwd("one_hot-9x1-d7", "one_hot", {"a": np.array([[0], [6], [3], [3], [1], [7], [-1], [5], [2]], np.int32)},
     lambda b, t: b.one_hot(t["a"], depth=7), lambda v: (v["a"] == np.arange(7)).astype(np.float32))
_fwd("one_hot-2x3x1-d5", "one_hot", {"a": _rng("oh").integers(0, 5, (2, 3, 1)).astype(np.int32)},
     lambda b, t: b.one_hot(t["a"], depth=5), lambda v: (v["a"] == np.arange(5)).astype(np.float32))


def _torch_vjp(fn, x, ct):
    """d/dx sum(fn(x) * ct), by torch autograd in float64."""
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad((fn(t) * torch.tensor(ct, dtype=torch.float64)).sum(), t)
    return g.numpy()


for _xs, _ws, _at in _CONV[:3]:
    _id = f"conv2d_weight_grad-{_sh(_xs)}-{_sh(_ws)}"
    _r = _rng(_id)
    _x = normal(_r, _xs)
    _w = normal(_r, _ws)
    _y = _conv_t(torch.tensor(_x), torch.tensor(_w), **_at)
    _gy = normal(_r, tuple(_y.shape))
    _fwd(_id, "conv2d_weight_grad", {"a": _x, "gy": _gy},
         lambda b, t, _at=_at, _ws=_ws: b.op("conv2d_weight_grad", t["a"], t["gy"], **_at, kernel=_ws[2:]),
         lambda v, _at=_at, _w=_w: _torch_vjp(lambda w: _conv_t(torch.tensor(v["a"]), w, **_at), _w, v["gy"]),
         exact=False)

for _xs, _at in _POOL:
    for _op, _fn, _extra in (("max_pool2d", F.max_pool2d, {}), ("avg_pool2d", F.avg_pool2d,
                                                                 {"count_include_pad": False})):
        _id = f"{_op}_grad-{_sh(_xs)}-k{''.join(map(str, _at['kernel']))}-{len(_at)}"
        _r = _rng(_id)
        _x = normal(_r, _xs)
        _y = _pool_t(_fn, torch.tensor(_x), **_at, **_extra)
        _fwd(_id, f"{_op}_grad", {"a": _x, "gy": normal(_r, tuple(_y.shape))},
             lambda b, t, _op=_op, _at=_at, _extra=_extra: b.op(f"{_op}_grad", t["a"], t["gy"], **_at, **_extra),
             lambda v, _fn=_fn, _at=_at, _extra=_extra: _torch_vjp(lambda x: _pool_t(_fn, x, **_at, **_extra),
                                                                   v["a"], v["gy"]),
             exact=False)

_fwd("scatter_add-4x3x5-rows9", "scatter_add",
     {"a": normal(_rng("scatter"), (4, 3, 5)),
      "idx": np.array([[0, 8, 0], [-1, 2, 0], [3, 3, 3], [7, 0, -9]], np.int32)},
     lambda b, t: b.scatter_add(t["a"], t["idx"], rows=9),
     lambda v: torch.zeros(9, 5, dtype=torch.float64).index_add_(
         0, torch.tensor(v["idx"].reshape(-1).astype(np.int64) % 9), torch.tensor(v["a"].reshape(-1, 5))).numpy(),
     exact=False)
_id = "silu_grad-7x13"
_fwd(_id, "silu_grad", {"a": with_values(normal(_rng(_id), (7, 13), 3.0), [30, -30, 1e-4, 0.0])},
     lambda b, t: b.silu_grad(t["a"]),
     lambda v: _torch_vjp(F.silu, v["a"], np.ones_like(v["a"])), exact=False)


def _torch_gelu_grad(x, approximate):
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(F.gelu(t, approximate=approximate).sum(), t)
    return g.numpy()


for _ap in ("none", "tanh"):
    for _s in ((7, 13), (3, 5, 17)):
        _id = f"gelu_grad_{_ap}-{_sh(_s)}"
        _fwd(_id, "gelu_grad", {"a": with_values(normal(_rng(_id), _s, 3.0), [10, -10, 1e-4, -6.0, 0.0])},
             lambda b, t, _ap=_ap: b.gelu_grad(t["a"], approximate=_ap),
             lambda v, _ap=_ap: _torch_gelu_grad(v["a"], _ap), exact=False)


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

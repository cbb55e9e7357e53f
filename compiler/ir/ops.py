"""The op table: one row per op, with its shape rule, numpy reference, gradient rule
and lowering. A test walks the table and fails when a row is incomplete.

Lowering is one of:
  ("elementwise", expr)  a WGSL expression over operands {0}, {1}, ... ; fusable
  ("view",)              no kernel: the output aliases its input's buffer
  ("kernel", name)       a kernel template of its own (compiler/codegen/templates/NAME.wgsl)
  ("decompose",)         rewritten into other ops by `decompose` before scheduling
  ("leaf",)              a value that exists before the program runs
Gradient rules take (emitter, node, node_id, grad_id) and return one gradient id (or
None) per input; they build the gradient out of other rows of this table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

try:  # scipy is optional; math.erf vectorised is the fallback
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover
    _erf = np.vectorize(math.erf, otypes=[np.float64])


@dataclass(frozen=True)
class OpRow:
    name: str
    shape_rule: Callable
    reference: Callable  # (list of ndarrays, attrs dict) -> ndarray
    gradient: Callable | None  # None: not differentiable (integer or leaf ops)
    lowering: tuple


OPS: dict = {}


def row(name, shape_rule, reference, gradient, lowering):
    OPS[name] = OpRow(name, shape_rule, reference, gradient, lowering)


# ---------------------------------------------------------------- shape rules
def same_shape(nodes, at):
    return nodes[0].dtype, nodes[0].shape


def broadcast_shape(nodes, at):
    shape = np.broadcast_shapes(*(n.shape for n in nodes))
    dts = {n.dtype for n in nodes}
    assert len(dts) == 1, f"mixed dtypes {sorted(dts)}"
    return nodes[0].dtype, shape


def mask_broadcast(nodes, at):
    """Comparisons: inputs of one dtype, broadcast; a 0 / 1 f32 mask out."""
    return "f32", broadcast_shape(nodes, at)[1]


def _norm_axes(axes, rank):
    out = tuple(sorted(a % rank for a in axes))
    assert len(set(out)) == len(out), f"repeated axes {axes}"
    return out


def _reduce_shape(nodes, at):
    shape = nodes[0].shape
    axes = _norm_axes(at["axes"], len(shape))
    if at.get("keepdims", True):
        out = tuple(1 if a in axes else d for a, d in enumerate(shape))
    else:
        out = tuple(d for a, d in enumerate(shape) if a not in axes)
    return nodes[0].dtype, out


def _reshape_shape(nodes, at):
    shape = tuple(at["shape"])
    assert int(np.prod(shape)) == nodes[0].size, f"cannot reshape {nodes[0].shape} to {shape}"
    return nodes[0].dtype, shape


def _transpose_shape(nodes, at):
    perm = tuple(at["perm"])
    assert sorted(perm) == list(range(len(nodes[0].shape))), f"bad permutation {perm}"
    return nodes[0].dtype, tuple(nodes[0].shape[p] for p in perm)


def _broadcast_to_shape(nodes, at):
    shape = tuple(at["shape"])
    assert np.broadcast_shapes(nodes[0].shape, shape) == shape, f"cannot broadcast {nodes[0].shape} to {shape}"
    return nodes[0].dtype, shape


def _matmul_shape(nodes, at):
    a, b = nodes[0].shape, nodes[1].shape
    assert len(a) >= 2 and len(b) >= 2, "matmul needs inputs of rank 2 or more"
    m, ka = (a[-1], a[-2]) if at.get("trans_a") else (a[-2], a[-1])
    kb, n = (b[-1], b[-2]) if at.get("trans_b") else (b[-2], b[-1])
    assert ka == kb, f"inner dimensions differ: {ka} vs {kb}"
    batch = np.broadcast_shapes(a[:-2], b[:-2])
    return "f32", tuple(batch) + (m, n)


def _row_shape(nodes, at):
    assert len(nodes[0].shape) >= 1
    return "f32", nodes[0].shape


def _cast_shape(nodes, at):
    return at["to"], nodes[0].shape


def _one_hot_shape(nodes, at):
    s = nodes[0].shape
    assert nodes[0].dtype == "i32", "one_hot takes integer class ids"
    assert s and s[-1] == 1, "one_hot input ends in a dimension of 1"
    return "f32", s[:-1] + (int(at["depth"]),)


def _loss_shape(nodes, at):
    return "f32", ()


def _cross_entropy_shape(nodes, at):
    x, labels = nodes[0], nodes[1]
    assert len(x.shape) == 2, f"cross_entropy takes logits [batch, classes], got {x.shape}"
    assert labels.dtype == "i32", "cross_entropy labels are integer class ids"
    assert labels.shape == x.shape[:1], f"labels shape {labels.shape} != batch {x.shape[:1]}"
    if len(nodes) > 2:
        assert nodes[2].shape == x.shape[:1], "row mask is [batch]"
    return "f32", ()


def _mse_shape(nodes, at):
    assert nodes[0].shape == nodes[1].shape, f"mse of {nodes[0].shape} and {nodes[1].shape}"
    if len(nodes) > 2:
        assert nodes[2].shape == nodes[0].shape[:1], "row mask is [batch]"
    return "f32", ()


def _leaf_shape(nodes, at):
    raise AssertionError("leaves are made by Emitter.leaf")


# --------------------------------------------------------- numpy references
def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _log_softmax(x):
    s = x - x.max(axis=-1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=-1, keepdims=True))


def _gelu(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)).astype(x.dtype))


def _gelu_grad(x, approximate):
    if approximate == "tanh":
        c = math.sqrt(2 / math.pi)
        t = np.tanh(c * (x + 0.044715 * x**3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)
    cdf = 0.5 * (1 + _erf(x / math.sqrt(2)).astype(x.dtype))
    return cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _pow(x, c):
    return np.power(x, x.dtype.type(c))


def _matmul_ref(a, b, at):
    if at.get("trans_a"):
        a = np.swapaxes(a, -1, -2)
    if at.get("trans_b"):
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


def _mask_or_ones(xs, n, dtype):
    return xs[2].astype(dtype) if len(xs) > 2 else np.ones(n, dtype)


def _cross_entropy_ref(xs, at):
    x, labels = xs[0], xs[1]
    mask = _mask_or_ones(xs, x.shape[0], x.dtype)
    hits = labels[:, None] == np.arange(x.shape[1])  # as the one_hot of the lowering: none outside the classes
    picked = np.where(hits, _log_softmax(x), 0).sum(axis=1)
    return np.asarray(-(picked * mask).sum() / max(mask.sum(), 1))


def _mse_ref(xs, at):
    d = xs[0] - xs[1]
    mask = _mask_or_ones(xs, d.shape[0], d.dtype)
    per_row = (d * d).reshape(d.shape[0], -1).sum(axis=1)
    count = max(mask.sum(), 1) * (d.size // max(d.shape[0], 1))
    return np.asarray((per_row * mask).sum() / count)


def _erf_ref(x):
    return _erf(x).astype(x.dtype)


def is_int(x) -> bool:
    return np.asarray(x).dtype.kind in "iu"


def trunc_div(a, b):
    """Integer division as WGSL's i32 `/`: rounded toward zero, a / 0 is a (in int64: exact)."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    safe = np.where(b == 0, 1, b)
    return np.where(b == 0, a, np.abs(a) // np.abs(safe) * np.sign(a) * np.sign(safe))


def _div_ref(xs, at):
    return trunc_div(xs[0], xs[1]) if is_int(xs[0]) else xs[0] / xs[1]


# ---------------------------------------------------------- gradient rules
def _g_add(e, n, i, g):
    return [e.sum_to(g, e.shape(n.inputs[0])), e.sum_to(g, e.shape(n.inputs[1]))]


def _g_sub(e, n, i, g):
    return [e.sum_to(g, e.shape(n.inputs[0])), e.sum_to(e.op("neg", g), e.shape(n.inputs[1]))]


def _g_mul(e, n, i, g):
    a, b = n.inputs
    return [e.sum_to(e.op("mul", g, b), e.shape(a)), e.sum_to(e.op("mul", g, a), e.shape(b))]


def _g_div(e, n, i, g):
    a, b = n.inputs
    ga = e.op("div", g, b)
    gb = e.op("neg", e.op("mul", ga, i))  # -g * a / b^2 = -(g / b) * out
    return [e.sum_to(ga, e.shape(a)), e.sum_to(gb, e.shape(b))]


def _unary(fn):
    """A gradient rule g * f(x, out) for one-input elementwise ops."""
    return lambda e, n, i, g: [fn(e, n.inputs[0], i, g, n)]


_g_neg = _unary(lambda e, x, y, g, n: e.op("neg", g))
_g_exp = _unary(lambda e, x, y, g, n: e.op("mul", g, y))
_g_expm1 = _unary(lambda e, x, y, g, n: e.op("mul", g, e.op("exp", x)))
_g_log = _unary(lambda e, x, y, g, n: e.op("div", g, x))
_g_sqrt = _unary(lambda e, x, y, g, n: e.op("div", e.scale(g, 0.5), y))
# from the output, as PyTorch does: relu's input (often a residual sum) need not outlive it
_g_relu = _unary(lambda e, x, y, g, n: e.op("mul", g, e.op("step", y)))
_g_sigmoid = _unary(lambda e, x, y, g, n: e.op("mul", g, e.op("mul", y, e.op("sub", e.const(1.0), y))))
_g_tanh = _unary(lambda e, x, y, g, n: e.op("mul", g, e.op("sub", e.const(1.0), e.op("mul", y, y))))
_g_gelu = _unary(lambda e, x, y, g, n: e.op("mul", g, e.op("gelu_grad", x, approximate=n.attr("approximate"))))
_g_erf = _unary(lambda e, x, y, g, n: e.op("mul", g, e.scale(
    e.op("exp", e.op("neg", e.op("mul", x, x))), 2 / math.sqrt(math.pi))))


def _g_pow(e, n, i, g):
    c = n.attr("exponent")
    x = n.inputs[0]
    d = e.const(c) if c - 1 == 0 else e.scale(e.op("pow", x, exponent=c - 1), c)
    return [e.op("mul", g, d)]


def _g_reshape(e, n, i, g):
    return [e.reshape(g, e.shape(n.inputs[0]))]


def _g_transpose(e, n, i, g):
    inv = tuple(int(p) for p in np.argsort(n.attr("perm")))
    return [e.op("transpose", g, perm=inv)]


def _g_broadcast_to(e, n, i, g):
    return [e.sum_to(g, e.shape(n.inputs[0]))]


def _keep(e, n, g):
    """The gradient of a reduction, reshaped to keepdims form."""
    x = n.inputs[0]
    axes = _norm_axes(n.attr("axes"), len(e.shape(x)))
    kshape = tuple(1 if a in axes else d for a, d in enumerate(e.shape(x)))
    return e.reshape(g, kshape), kshape


def _g_reduce_sum(e, n, i, g):
    gk, _ = _keep(e, n, g)
    return [e.op("broadcast_to", gk, shape=e.shape(n.inputs[0]))]


def _g_reduce_max(e, n, i, g):
    x = n.inputs[0]
    gk, kshape = _keep(e, n, g)
    mk = e.reshape(i, kshape)
    hit = e.op("eq", x, mk)  # ties share the gradient, as torch.amax does
    count = e.op("reduce_sum", hit, axes=n.attr("axes"), keepdims=True)
    return [e.op("mul", hit, e.op("div", gk, count))]


def _g_matmul(e, n, i, g):
    a, b = n.inputs
    ta, tb = bool(n.attr("trans_a")), bool(n.attr("trans_b"))
    if ta:
        ga = e.op("matmul", b, g, trans_a=tb, trans_b=True)
    else:
        ga = e.op("matmul", g, b, trans_b=not tb)
    if tb:
        gb = e.op("matmul", g, a, trans_a=True, trans_b=ta)
    else:
        gb = e.op("matmul", a, g, trans_a=not ta)
    return [e.sum_to(ga, e.shape(a)), e.sum_to(gb, e.shape(b))]


def _g_softmax(e, n, i, g):
    gy = e.op("mul", g, i)
    s = e.op("reduce_sum", gy, axes=(-1,), keepdims=True)
    return [e.op("sub", gy, e.op("mul", i, s))]


def _g_log_softmax(e, n, i, g):
    s = e.op("reduce_sum", g, axes=(-1,), keepdims=True)
    return [e.op("sub", g, e.op("mul", e.op("exp", i), s))]


def _row_weights(e, n, rows):
    """Per-row weight (mask / count) as [rows, 1], for the mean of a masked loss."""
    if len(n.inputs) > 2:
        mask = n.inputs[2]
        count = e.op("maximum", e.op("reduce_sum", mask, axes=(0,), keepdims=True), e.const(1.0))
        return e.reshape(e.op("div", mask, count), (rows, 1))
    return e.const(1.0 / rows)


def _g_cross_entropy(e, n, i, g):
    x, labels = n.inputs[:2]
    rows, classes = e.shape(x)
    onehot = e.op("one_hot", e.reshape(labels, (rows, 1)), depth=classes)
    d = e.op("sub", e.op("softmax", x), onehot)
    w = e.op("mul", _row_weights(e, n, rows), g)
    return [e.op("mul", d, w), None] + [None] * (len(n.inputs) - 2)


def _g_mse(e, n, i, g):
    a, b = n.inputs[:2]
    shape = e.shape(a)
    rows, per_row = shape[0], int(np.prod(shape[1:], dtype=np.int64))
    w = e.scale(_row_weights(e, n, rows), 2.0 / per_row)
    w = e.reshape(w, (rows,) + (1,) * (len(shape) - 1)) if e.shape(w) else w
    d = e.op("mul", e.op("sub", a, b), e.op("mul", w, g))
    return [d, e.op("neg", d)] + [None] * (len(n.inputs) - 2)


def _g_maximum(e, n, i, g):
    a, b = n.inputs
    # ties split the gradient evenly, as torch.maximum does
    wa = e.op("add", e.op("step", e.op("sub", a, b)), e.scale(e.op("eq", a, b), 0.5))
    wb = e.op("sub", e.const(1.0), wa)
    return [e.sum_to(e.op("mul", g, wa), e.shape(a)), e.sum_to(e.op("mul", g, wb), e.shape(b))]


# ------------------------------------------------------------ decompositions
def _masked_mean(e, n, per_row):
    """sum(per_row * weight): weight is mask / count, or 1 / rows without a mask."""
    rows = e.shape(per_row)[0]
    w = _row_weights(e, n, rows)
    w = e.reshape(w, (rows,)) if e.shape(w) else w
    return e.reshape(e.op("reduce_sum", e.op("mul", per_row, w), axes=(0,), keepdims=False), ())


def _d_cross_entropy(e, n):
    x, labels = n.inputs[:2]
    rows, classes = e.shape(x)
    onehot = e.op("one_hot", e.reshape(labels, (rows, 1)), depth=classes)
    picked = e.op("reduce_sum", e.op("mul", e.op("log_softmax", x), onehot), axes=(1,), keepdims=False)
    return e.op("neg", _masked_mean(e, n, picked))


def _d_mse(e, n):
    a, b = n.inputs[:2]
    shape = e.shape(a)
    d = e.op("sub", a, b)
    sq = e.reshape(e.op("mul", d, d), (shape[0], int(np.prod(shape[1:], dtype=np.int64))))
    per_row = e.op("reduce_sum", sq, axes=(1,), keepdims=False)
    return e.scale(_masked_mean(e, n, per_row), 1.0 / max(1, int(np.prod(shape[1:], dtype=np.int64))))


# ----------------------------------------------------------------- the table
EW = "elementwise"
for _name in ("input", "param", "state", "constant", "const"):
    row(_name, _leaf_shape, None, None, ("leaf",))

row("add", broadcast_shape, lambda xs, at: xs[0] + xs[1], _g_add, (EW, "({0} + {1})"))
row("sub", broadcast_shape, lambda xs, at: xs[0] - xs[1], _g_sub, (EW, "({0} - {1})"))
row("mul", broadcast_shape, lambda xs, at: xs[0] * xs[1], _g_mul, (EW, "({0} * {1})"))
row("div", broadcast_shape, _div_ref, _g_div, (EW, "({0} / {1})"))
row("maximum", broadcast_shape, lambda xs, at: np.maximum(xs[0], xs[1]), _g_maximum, (EW, "max({0}, {1})"))
row("eq", mask_broadcast, lambda xs, at: (xs[0] == xs[1]).astype(np.float64 if xs[0].dtype == np.float64 else np.float32),
    None, (EW, "select(0.0, 1.0, {0} == {1})"))
row("neg", same_shape, lambda xs, at: -xs[0], _g_neg, (EW, "(-{0})"))
row("exp", same_shape, lambda xs, at: np.exp(xs[0]), _g_exp, (EW, "exp({0})"))
row("expm1", same_shape, lambda xs, at: np.expm1(xs[0]), _g_expm1, (EW, "mn_expm1({0})"))
row("log", same_shape, lambda xs, at: np.log(xs[0]), _g_log, (EW, "log({0})"))
row("sqrt", same_shape, lambda xs, at: np.sqrt(xs[0]), _g_sqrt, (EW, "sqrt({0})"))
row("relu", same_shape, lambda xs, at: np.maximum(xs[0], 0), _g_relu, (EW, "max({0}, 0.0)"))
row("step", same_shape, lambda xs, at: (xs[0] > 0).astype(xs[0].dtype), None, (EW, "select(0.0, 1.0, {0} > 0.0)"))
# 1 where x is NaN or +-infinity: tested on the bits, since WGSL lets compilers assume finite floats
row("nonfinite", same_shape, lambda xs, at: (~np.isfinite(xs[0])).astype(xs[0].dtype), None, (EW, "mn_nonfinite({0})"))
row("sigmoid", same_shape, lambda xs, at: 1 / (1 + np.exp(-xs[0])), _g_sigmoid, (EW, "mn_sigmoid({0})"))
row("tanh", same_shape, lambda xs, at: np.tanh(xs[0]), _g_tanh, (EW, "mn_tanh({0})"))
row("erf", same_shape, lambda xs, at: _erf_ref(xs[0]), _g_erf, (EW, "mn_erf({0})"))
row("gelu", same_shape, lambda xs, at: _gelu(xs[0], at.get("approximate", "none")), _g_gelu,
    (EW, {"none": "mn_gelu({0})", "tanh": "mn_gelu_tanh({0})"}))
row("gelu_grad", same_shape, lambda xs, at: _gelu_grad(xs[0], at.get("approximate", "none")), None,
    (EW, {"none": "mn_gelu_grad({0})", "tanh": "mn_gelu_tanh_grad({0})"}))
row("pow", same_shape, lambda xs, at: _pow(xs[0], at["exponent"]), _g_pow, (EW, "mn_pow({0}, {exponent})"))
row("cast", _cast_shape, lambda xs, at: xs[0].astype(np.int32 if at["to"] == "i32" else xs[0].dtype
                                                  if xs[0].dtype.kind == "f" else np.float32), None,
    (EW, {"f32": "f32({0})", "i32": "i32({0})"}))
row("one_hot", _one_hot_shape, lambda xs, at: (xs[0] == np.arange(at["depth"])).astype(np.float32), None,
    (EW, "select(0.0, 1.0, {0} == i32({i_last}))"))
row("broadcast_to", _broadcast_to_shape, lambda xs, at: np.broadcast_to(xs[0], at["shape"]).copy(),
    _g_broadcast_to, (EW, "{0}"))
row("transpose", _transpose_shape, lambda xs, at: np.transpose(xs[0], at["perm"]).copy(), _g_transpose, (EW, "{0}"))
row("reshape", _reshape_shape, lambda xs, at: xs[0].reshape(at["shape"]), _g_reshape, ("view",))
row("reduce_sum", _reduce_shape, lambda xs, at: xs[0].sum(axis=_norm_axes(at["axes"], xs[0].ndim),
                                                        keepdims=at.get("keepdims", True)),
    _g_reduce_sum, ("kernel", "reduce"))
row("reduce_max", _reduce_shape, lambda xs, at: xs[0].max(axis=_norm_axes(at["axes"], xs[0].ndim),
                                                        keepdims=at.get("keepdims", True)),
    _g_reduce_max, ("kernel", "reduce"))
row("matmul", _matmul_shape, lambda xs, at: _matmul_ref(xs[0], xs[1], at), _g_matmul, ("kernel", "matmul"))
row("softmax", _row_shape, lambda xs, at: _softmax(xs[0]), _g_softmax, ("kernel", "softmax"))
row("log_softmax", _row_shape, lambda xs, at: _log_softmax(xs[0]), _g_log_softmax, ("kernel", "softmax"))
row("cross_entropy", _cross_entropy_shape, _cross_entropy_ref, _g_cross_entropy, ("decompose", _d_cross_entropy))
row("mse", _mse_shape, _mse_ref, _g_mse, ("decompose", _d_mse))

NOT_DIFFERENTIABLE = {"input", "param", "state", "constant", "const", "eq", "step", "gelu_grad", "cast", "one_hot", "nonfinite"}

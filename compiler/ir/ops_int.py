"""Op table rows that integer tensors need, and the ops whose outputs are indices.

Integers are i32 on the GPU and int32 / int64 in the interpreter (exact). The arithmetic
rows of ops.py take them as they take floats (add, sub, mul, div, maximum, neg, eq,
where, ...); the rows here add what floats got by other means: comparisons without a
subtraction (which would overflow), remainders, abs, sign and bitwise logic. Booleans are
f32 masks holding 0 / 1, as everywhere in the IR.

argmax / argmin and topk / topk_indices decompose into reductions: the index of the
maximum is the least index whose value equals it, and an element's place in the top k is
the number of elements that beat it (greater, or equal at a lower index). Indices are
counted in f32 (exact below 2^24 elements per axis).
"""
from __future__ import annotations

import numpy as np

from .autodiff import grad_via_decomposition as _via
from .ops import EW, NOT_DIFFERENTIABLE, broadcast_shape, is_int, mask_broadcast, row, same_shape, trunc_div

# ------------------------------------------------------------- elementwise rows
# shifts by a negative amount or by 32 or more give what shifting one bit at a time would (as
# ONNX says): 0 to the left; the sign's bits to the right (WGSL would shift by the amount mod 32)
BITWISE = {"and": "({0} & {1})", "or": "({0} | {1})", "xor": "({0} ^ {1})",
           "shl": "select(i32(0), ({0} << u32({1})), u32({1}) < 32u)",
           "shr": "select(({0} >> 31u), ({0} >> u32({1})), u32({1}) < 32u)"}


def _bitwise_ref(xs, at):
    a, b = np.broadcast_arrays(np.asarray(xs[0], np.int32), np.asarray(xs[1], np.int32))
    kind = at["kind"]
    if kind in ("shl", "shr"):
        inside = (b >= 0) & (b < 32)
        if kind == "shl":
            return np.where(inside, np.left_shift(a, np.where(inside, b, 0)), 0).astype(np.int32)
        return np.where(inside, np.right_shift(a, np.where(inside, b, 0)), a >> 31).astype(np.int32)
    return {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[kind](a, b)


def _mod_ref(xs, at):
    """WGSL's `%`: the remainder of division rounded toward zero (the dividend's sign; x % 0 is 0)."""
    a, b = xs
    if not is_int(a):
        return np.fmod(a, b)
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    return np.where(b == 0, 0, a - b * trunc_div(a, b))


def _int_shape(nodes, at):
    assert all(n.dtype == "i32" for n in nodes), "bitwise ops take integers"
    return broadcast_shape(nodes, at)


def _g_abs(e, n, i, g):
    return [e.op("mul", g, e.op("sign", n.inputs[0]))]


# a > b as a 0/1 mask: exact for integers too (step(a - b) would overflow on them)
row("greater", mask_broadcast, lambda xs, at: (xs[0] > xs[1]).astype(np.float32), None,
    (EW, "select(0.0, 1.0, {0} > {1})"))
# the remainder of division rounded toward zero (C's fmod; ONNX Mod with fmod=1); x % 0 is 0.
# Written with |divisor|: NVIDIA's driver returned 7 for 7 % -3 (the result takes the dividend's sign)
row("mod", broadcast_shape, _mod_ref, None, (EW, "(sign({0}) * (abs({0}) % abs({1})))"))
row("abs", same_shape, lambda xs, at: np.abs(xs[0]), _g_abs, (EW, "abs({0})"))
row("sign", same_shape, lambda xs, at: np.sign(xs[0]), None, (EW, "sign({0})"))
row("bitwise", _int_shape, _bitwise_ref, None, (EW, BITWISE))
row("bit_not", _int_shape, lambda xs, at: np.invert(np.asarray(xs[0], np.int32)), None, (EW, "(~{0})"))
NOT_DIFFERENTIABLE.update({"greater", "mod", "sign", "bitwise", "bit_not"})


# ------------------------------------------------------------ argmax and argmin
def _arg_shape(nodes, at):
    shape = nodes[0].shape
    assert shape, "argmax / argmin of a scalar"
    a = at["axis"] % len(shape)
    assert shape[a] > 0, "argmax / argmin over an empty axis"
    keep = shape[:a] + (1,) + shape[a + 1:]
    return "i32", keep if at.get("keepdims", True) else shape[:a] + shape[a + 1:]


def _arg_ref(xs, at):
    x = xs[0]
    a = at["axis"] % x.ndim
    if at.get("smallest"):
        x = -x.astype(np.int64) if is_int(x) else -x
    if at.get("last"):
        i = x.shape[a] - 1 - np.argmax(np.flip(x, a), axis=a)
    else:
        i = np.argmax(x, axis=a)
    i = np.expand_dims(i, a) if at.get("keepdims", True) else i
    return i.astype(np.int32)


def _iota(e, n, axis, rank, scale=1.0, offset=0.0):
    """A constant offset + scale * index along `axis`, shaped to broadcast over rank axes."""
    shape = [1] * rank
    shape[axis] = n
    return e.constant((offset + scale * np.arange(n, dtype=np.float64)).reshape(shape))


def _d_arg(e, n):
    x = n.inputs[0]
    shape = e.shape(x)
    a = n.attr("axis") % len(shape)
    if n.attr("smallest"):
        x = e.op("neg", x)
    top = e.op("reduce_max", x, axes=(a,), keepdims=True)
    hit = e.op("eq", x, top)
    d = shape[a]
    if n.attr("last"):  # the greatest index that holds the maximum
        idx = e.op("reduce_max", e.op("where", hit, _iota(e, d, a, len(shape)), e.const(-1.0)),
                   axes=(a,), keepdims=True)
    else:  # the least: the greatest of the negated indices, negated
        idx = e.op("neg", e.op("reduce_max", e.op("where", hit, _iota(e, d, a, len(shape), -1.0), e.const(-d)),
                               axes=(a,), keepdims=True))
    return e.reshape(e.op("cast", idx, to="i32"), n.shape)


# the index of the greatest (smallest=True: least) element along `axis`; ties: the first (last=True: the last)
row("argmax", _arg_shape, _arg_ref, None, ("decompose", _d_arg))
NOT_DIFFERENTIABLE.add("argmax")


# ------------------------------------------------------------------------ top k
def _topk_shape(nodes, at, dtype=None):
    shape = nodes[0].shape
    assert shape, "topk of a scalar"
    a = at["axis"] % len(shape)
    k = int(at["k"])
    assert 0 < k <= shape[a], f"topk of {k} along an axis of {shape[a]}"
    return dtype or nodes[0].dtype, shape[:a] + (k,) + shape[a + 1:]


def _topk_order(x, at):
    """Indices that sort `x` along the axis, best first, ties by lower index (as ONNX)."""
    a = at["axis"] % x.ndim
    key = x.astype(np.int64) if is_int(x) else x
    order = np.argsort(key if at.get("smallest") else -key, axis=a, kind="stable")
    return np.take(order, np.arange(int(at["k"])), axis=a)


def _topk_ref(xs, at):
    return np.take_along_axis(xs[0], _topk_order(xs[0], at), at["axis"] % xs[0].ndim)


def _topk_indices_ref(xs, at):
    return _topk_order(xs[0], at).astype(np.int32)


def _topk_select(e, n):
    """(one-hot [..., k, d] of the selected elements, the input as [..., 1, d], d, perm):
    the axis moved last; element i's place is how many elements beat it."""
    x = n.inputs[0]
    shape = e.shape(x)
    rank, a = len(shape), n.attr("axis") % len(shape)
    perm = tuple(p for p in range(rank) if p != a) + (a,)
    if perm != tuple(range(rank)):
        x = e.op("transpose", x, perm=perm)
    lead, d, k = tuple(e.shape(x)[:-1]), shape[a], int(n.attr("k"))
    xi, xj = e.reshape(x, lead + (d, 1)), e.reshape(x, lead + (1, d))
    beats = e.op("greater", xi, xj) if n.attr("smallest") else e.op("greater", xj, xi)
    earlier = e.constant(np.tril(np.ones((d, d)), -1))  # [i, j]: 1 where j < i
    ties = e.op("mul", e.op("eq", xi, xj), earlier)
    place = e.op("reduce_sum", e.op("add", beats, ties), axes=(rank,), keepdims=False)  # [..., d]
    onehot = e.op("eq", e.reshape(place, lead + (1, d)), _iota(e, k, rank - 1, rank + 1))
    return onehot, xj, d, perm


def _topk_pick(e, onehot, values, perm):
    """The values at the one-hot's places (a sum of one value and zeros), the axis put back."""
    rank = len(perm)
    zero = e.const(0, e.node(values).dtype)
    y = e.op("reduce_sum", e.op("where", onehot, values, zero), axes=(rank,), keepdims=False)
    if perm != tuple(range(rank)):
        y = e.op("transpose", y, perm=tuple(int(p) for p in np.argsort(perm)))
    return y


def _d_topk(e, n):
    onehot, xj, d, perm = _topk_select(e, n)
    return _topk_pick(e, onehot, xj, perm)


def _d_topk_indices(e, n):
    onehot, _, d, perm = _topk_select(e, n)
    idx = _topk_pick(e, onehot, _iota(e, d, len(perm), len(perm) + 1), perm)
    return e.op("cast", idx, to="i32")


row("topk", _topk_shape, _topk_ref, _via, ("decompose", _d_topk))
row("topk_indices", lambda nodes, at: _topk_shape(nodes, at, "i32"), _topk_indices_ref, None,
    ("decompose", _d_topk_indices))
NOT_DIFFERENTIABLE.add("topk_indices")

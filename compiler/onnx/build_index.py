"""Graph builders for ops that read or write by index: GatherElements, GatherND,
ScatterElements / Scatter, ScatterND, TensorScatter, MaxUnpool, OneHot, Hardmax, Trilu, CumSum.

Element positions are flat ids into a tensor viewed as rows, read with `gather` and written
with `index_put`. Indices known at import time become constant ids; computed ones (i32
tensors) are turned into ids with float arithmetic, exact below 2^24, and cast back.
"""
from __future__ import annotations

import numpy as np

from .common import Known, as_ints

EXACT_IDS = 1 << 24  # float32 holds every integer below this


def _float_tensor(im, name, op):
    t = im.tensor(name)
    if t.dtype != "f32":
        raise NotImplementedError(f"node {im.label!r}: {op} of an integer tensor")
    return t


def zero_of(b, t):
    """The scalar 0 of t's dtype."""
    return b.const(0, "i32") if t.dtype == "i32" else b.const(0.0)


def flat_ids(im, name, lead, dims, strides, base):
    """i32 ids base + sum_j wrap(idx[..., j], dims[j]) * strides[j] of the index input
    `name` viewed as lead + (len(dims),); wrap adds dims[j] to a negative index."""
    b, v = im.b, im.env[name]
    k = len(dims)
    dims, strides = np.asarray(dims, np.int64), np.asarray(strides, np.int64)
    base = np.broadcast_to(np.asarray(base, np.int64), lead)
    if isinstance(v, Known):
        idx = np.asarray(im.known(name)).astype(np.int64).reshape(lead + (k,))
        idx = np.where(idx < 0, idx + dims, idx)
        if idx.size and ((idx < 0) | (idx >= dims)).any():
            raise ValueError(f"node {im.label!r}: an index is out of range for axes of {dims.tolist()}")
        return b.constant_ids(base + (idx * strides).sum(-1))
    t = im.tensor(name)
    top = int(base.max(initial=0)) + int(((dims - 1) * strides).sum())
    if top >= EXACT_IDS:
        raise NotImplementedError(f"node {im.label!r}: computed indices into {top + 1} elements (at most 2^24)")
    f = b.reshape(b.op("cast", t, to="f32") if t.dtype == "i32" else t, lead + (k,))
    vec = (lambda a: b.const(float(a[0]))) if k == 1 else (lambda a: b.constant(a.astype(np.float64)))
    f = f + b.op("step", -f) * vec(dims)  # negative indices count from the end
    f = b.reshape(f * vec(strides), lead) if k == 1 else b.sum(f * vec(strides), [len(lead)])
    if base.any():
        f = f + b.constant(base.astype(np.float64))
    return b.op("cast", f, to="i32")


def _strides(shape):
    return [int(np.prod(shape[a + 1:], dtype=np.int64)) for a in range(len(shape))]


def _element_ids(im, x, name, axis):
    """Flat ids into x of an ONNX index input along `axis` (GatherElements, ScatterElements)."""
    ishape = tuple(_index_shape(im, name))
    st = _strides(x.shape)
    grid = np.indices(ishape, dtype=np.int64) if ishape else np.zeros((0,), np.int64)
    base = sum((grid[a] * st[a] for a in range(len(ishape)) if a != axis), np.zeros(ishape, np.int64))
    return flat_ids(im, name, ishape, [x.shape[axis]], [st[axis]], base), ishape


def _index_shape(im, name):
    v = im.env[name]
    return np.asarray(im.known(name)).shape if isinstance(v, Known) else v.shape


def _b_gather_elements(im, ins, at):
    b, x = im.b, im.tensor(ins[0])
    axis = int(at.get("axis", 0)) % len(x.shape)
    ids, ishape = _element_ids(im, x, ins[1], axis)
    return b.reshape(b.gather(b.reshape(x, (int(np.prod(x.shape)), 1)), ids), ishape)


def _nd_ids(im, x, name, batch):
    """(row ids, table rows, index lead shape) of GatherND / ScatterND: x viewed as
    [prod(shape[:batch + k]), *shape[batch + k:]]."""
    ishape = tuple(_index_shape(im, name))
    lead, k = ishape[:-1], ishape[-1]
    dims = x.shape[batch:batch + k]
    per_batch = int(np.prod(dims, dtype=np.int64))
    base = np.zeros(lead, np.int64)
    if batch:
        bidx = np.indices(lead[:batch], dtype=np.int64)
        flat_b = np.ravel_multi_index(tuple(bidx), x.shape[:batch])
        base = base + (flat_b * per_batch).reshape(lead[:batch] + (1,) * (len(lead) - batch))
    rows = int(np.prod(x.shape[:batch + k], dtype=np.int64))
    return flat_ids(im, name, lead, dims, _strides(dims), base), rows, lead, batch + k


def _b_gather_nd(im, ins, at):
    b, x = im.b, im.tensor(ins[0])
    ids, rows, lead, used = _nd_ids(im, x, ins[1], int(at.get("batch_dims", 0)))
    y = b.gather(b.reshape(x, (rows,) + x.shape[used:]), ids)
    return b.reshape(y, lead + x.shape[used:])


def _reduction(im, at):
    red = at.get("reduction", "none")
    if red not in ("none", "add", "mul", "max", "min"):
        raise NotImplementedError(f"node {im.label!r}: reduction {red!r}")
    return red


def _b_scatter_elements(im, ins, at):
    b, x = im.b, _float_tensor(im, ins[0], "ScatterElements")
    axis = int(at.get("axis", 0)) % len(x.shape)
    ids, ishape = _element_ids(im, x, ins[1], axis)
    upd = b.reshape(_float_tensor(im, ins[2], "ScatterElements"), ishape + (1,))
    y = b.op("index_put", b.reshape(x, (int(np.prod(x.shape)), 1)), ids, upd, reduction=_reduction(im, at))
    return b.reshape(y, x.shape)


def _b_scatter_nd(im, ins, at):
    b, x = im.b, _float_tensor(im, ins[0], "ScatterND")
    ids, rows, lead, used = _nd_ids(im, x, ins[1], 0)
    upd = _float_tensor(im, ins[2], "ScatterND")
    y = b.op("index_put", b.reshape(x, (rows,) + x.shape[used:]), ids, b.reshape(upd, lead + x.shape[used:]),
             reduction=_reduction(im, at))
    return b.reshape(y, x.shape)


# ------------------------------------------------------------ masks and sums
def _to_last(b, x, axis):
    """(x with `axis` moved last, the permutation that moves it back)."""
    rank = len(x.shape)
    perm = [a for a in range(rank) if a != axis] + [axis]
    back = list(np.argsort(perm))
    return b.transpose(x, perm), back


MATMUL_SCAN = 256  # longer axes: a scan of log2(n) shifted adds, not an n x n matrix


def _shifted(b, x, by):
    """x moved `by` places along its last axis (toward the end when by > 0), zeros let in."""
    n, rank = x.shape[-1], len(x.shape)
    if abs(by) >= n:
        return None
    part = b.slice(x, starts=(0,) * (rank - 1) + (max(-by, 0),), steps=(1,) * rank, shape=x.shape[:-1] + (n - abs(by),))
    return b.pad(part, starts=(0,) * (rank - 1) + (max(by, 0),), steps=(1,) * rank, shape=x.shape,
                 value=0 if x.dtype == "i32" else 0.0)


def running_sum(b, x, axis, exclusive=False, reverse=False):
    """Cumulative sum along `axis`: a matmul with a 0/1 triangular matrix, or on long axes
    and integers (exact in i32) a scan (each step adds the running sums 1, 2, 4, ... places back)."""
    n = x.shape[axis]
    xt, back = _to_last(b, x, axis)
    sign = -1 if reverse else 1
    if n <= MATMUL_SCAN and x.dtype == "f32":
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        tri = {(False, False): i <= j, (True, False): i < j, (False, True): i >= j, (True, True): i > j}
        flat = b.reshape(xt, (-1, n))
        y = b.reshape(b.matmul(flat, b.constant(tri[exclusive, reverse].astype(np.float64))), xt.shape)
        return b.transpose(y, back)
    y = _shifted(b, xt, sign) if exclusive else xt
    step = 1
    while step < n:
        y = y + _shifted(b, y, sign * step)
        step *= 2
    return b.transpose(y, back)


def _b_cumsum(im, ins, at):
    x = im.tensor(ins[0])
    axis = int(np.asarray(im.known(ins[1], "axis")).reshape(-1)[0]) % len(x.shape)
    return running_sum(im.b, x, axis, bool(at.get("exclusive", 0)), bool(at.get("reverse", 0)))


def _b_trilu(im, ins, at):
    x = im.tensor(ins[0])
    k = int(np.asarray(im.opt(ins, 1, "k")).reshape(-1)[0]) if len(ins) > 1 and ins[1] else 0
    m, n = x.shape[-2:]
    d = np.arange(n)[None, :] - np.arange(m)[:, None]
    keep = d >= k if at.get("upper", 1) else d <= k
    if keep.all():
        return x
    return im.b.op("where", im.b.constant(keep.astype(np.float64)), x, zero_of(im.b, x))  # 0 also where x is inf or NaN


def _b_hardmax(im, ins, at):
    """1 at the first maximum along the axis (opset < 13: of the input flattened to 2-D): the
    maximum's positions weighted n, n - 1, ... and the largest weight picked."""
    b, x = im.b, _float_tensor(im, ins[0], "Hardmax")
    shape = x.shape
    if im.opset < 13:
        axis = int(at.get("axis", 1)) % len(shape)
        x, axis = b.reshape(x, (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))), 1
    else:
        axis = int(at.get("axis", -1)) % len(shape)
    n = x.shape[axis]
    if n >= EXACT_IDS:
        raise NotImplementedError(f"node {im.label!r}: Hardmax over {n} elements (at most 2^24)")
    rank = len(x.shape)
    weight = b.constant((n - np.arange(n, dtype=np.float64)).reshape((n,) + (1,) * (rank - 1 - axis)))
    ranked = b.op("eq", x, b.max(x, [axis], True)) * weight
    return im.mask(b.reshape(b.op("eq", ranked, b.max(ranked, [axis], True)), shape))


def _b_one_hot(im, ins, at):
    b = im.b
    depth = int(np.asarray(im.known(ins[1], "depth")).reshape(-1)[0])
    values = im.env[ins[2]]
    if isinstance(values, Known):
        off, on = (b.const(float(v)) for v in np.asarray(values.value, np.float64).reshape(-1)[:2])
    else:
        vt = im.tensor(ins[2])
        off, on = (b.slice(vt, starts=(s,), steps=(1,), shape=(1,)) for s in (0, 1))
    v = im.env[ins[0]]
    if isinstance(v, Known):
        idx = np.asarray(v.value).astype(np.int64)
        idx = np.where(idx < 0, idx + depth, idx)
        hot = b.constant((idx[..., None] == np.arange(depth)).astype(np.float64))
        lead = idx.shape
    else:
        t = im.tensor(ins[0])
        f = b.op("cast", t, to="f32") if t.dtype == "i32" else t
        f = f + b.op("step", -f) * float(depth)
        lead = f.shape
        hot = b.op("eq", b.reshape(f, lead + (1,)), b.constant(np.arange(depth, dtype=np.float64)))
    y = b.op("where", hot, on, off)
    rank = len(lead) + 1
    axis = int(at.get("axis", -1)) % rank
    if axis == rank - 1:
        return y
    perm = list(range(axis)) + [rank - 1] + list(range(axis, rank - 1))
    return b.transpose(y, perm)


def _b_tensor_scatter(im, ins, at):
    """The cache with each batch item's update written along `axis` from its write index
    (mode circular: wrapping around): an index_put of rows [prefix * length + position]."""
    b, cache = im.b, _float_tensor(im, ins[0], "TensorScatter")
    upd = _float_tensor(im, ins[1], "TensorScatter")
    rank = len(cache.shape)
    axis = int(at.get("axis", -2)) % rank
    if axis == 0:
        raise ValueError(f"node {im.label!r}: TensorScatter along the batch axis")
    mode, length, count = at.get("mode", "linear"), cache.shape[axis], upd.shape[axis]
    if mode not in ("linear", "circular"):
        raise NotImplementedError(f"node {im.label!r}: TensorScatter mode {mode!r}")
    prefix, inner = cache.shape[:axis], int(np.prod(cache.shape[axis + 1:], dtype=np.int64))
    batch, rest = prefix[0], int(np.prod(prefix[1:], dtype=np.int64))
    pos = np.arange(count).reshape(1, 1, count)
    base = (np.arange(batch * rest).reshape(batch, rest, 1)) * length
    wv = im.env[ins[2]] if len(ins) > 2 and ins[2] else Known(np.zeros(batch, np.int64), "write_indices")
    if isinstance(wv, Known):
        at_pos = np.asarray(wv.value).astype(np.int64).reshape(batch, 1, 1) + pos
        if mode == "linear" and (at_pos.max() >= length or at_pos.min() < 0):
            raise ValueError(f"node {im.label!r}: a write index puts the update past the cache's {length}")
        ids = b.constant_ids(base + at_pos % length)
    else:
        start = b.reshape(im.tensor(ins[2]), (batch, 1, 1)) + b.constant_ids(pos)
        if mode == "circular":
            start = b.op("mod", start, b.const(length, "i32"))
        ids = start + b.constant_ids(base)
    rows = b.reshape(cache, (batch * rest * length, inner))
    y = b.op("index_put", rows, ids, b.reshape(upd, (batch, rest, count, inner)), reduction="none")
    return b.reshape(y, cache.shape)


def _b_max_unpool(im, ins, at):
    """X written at its flat indices into zeros of the size MaxPool's geometry gives, placed
    at the start of a larger output_shape when one is given (as the ONNX reference does)."""
    b, x = im.b, _float_tensor(im, ins[0], "MaxUnpool")
    kernel = as_ints(at["kernel_shape"])
    nd = len(kernel)
    strides = as_ints(at.get("strides", [1] * nd))
    pads = as_ints(at.get("pads", [0] * (2 * nd)))
    size = x.shape[:2] + tuple((x.shape[2 + i] - 1) * strides[i] - pads[i] - pads[nd + i] + kernel[i]
                               for i in range(nd))
    total = int(np.prod(size, dtype=np.int64))
    iv = im.env[ins[1]]
    ids = b.constant_ids(np.asarray(iv.value).astype(np.int64)) if isinstance(iv, Known) else im.tensor(ins[1])
    zeros = b.op("broadcast_to", b.const(0.0), shape=(total, 1))
    y = b.reshape(b.op("index_put", zeros, ids, b.reshape(x, ids.shape + (1,)), reduction="none"), size)
    out = tuple(as_ints(im.opt(ins, 2, "output_shape"))) if len(ins) > 2 and ins[2] else size
    if out == size:
        return y
    return b.pad(y, starts=(0,) * len(size), steps=(1,) * len(size), shape=out, value=0.0)


BUILD_INDEX = {
    "GatherElements": _b_gather_elements,
    "GatherND": _b_gather_nd,
    "ScatterElements": _b_scatter_elements,
    "Scatter": _b_scatter_elements,
    "ScatterND": _b_scatter_nd,
    "CumSum": _b_cumsum,
    "Trilu": _b_trilu,
    "Hardmax": _b_hardmax,
    "OneHot": _b_one_hot,
    "TensorScatter": _b_tensor_scatter,
    "MaxUnpool": _b_max_unpool,
}

# ops that take integer tensors: index inputs, and the data of gathers, Trilu, CumSum and OneHot
# (scatters' data must be float)
INT_OK_INDEX = frozenset({"GatherElements", "GatherND", "ScatterElements", "Scatter", "ScatterND", "OneHot", "Trilu",
                          "CumSum", "MaxUnpool", "TensorScatter"})
PARAM_INPUTS_INDEX = {"CumSum": (1,), "Trilu": (1,), "OneHot": (1,), "MaxUnpool": (2,)}

"""Graph builders that move data: reshapes, transposes, Gather, Slice, Pad, Concat,
Split, Where, Expand, Tile, DepthToSpace / SpaceToDepth, Compress, ReverseSequence."""
from __future__ import annotations

import numpy as np

from .common import flatten_shape, as_ints, Known, reshape_target, squeeze_shape, unsqueeze_shape
from .fold import split_sizes


def _b_reshape(im, ins, at):
    x = im.tensor(ins[0])
    return im.b.reshape(x, reshape_target(x.shape, im.known(ins[1], "the shape"), at.get("allowzero", 0)))


def _b_flatten(im, ins, at):
    x = im.tensor(ins[0])
    return im.b.reshape(x, flatten_shape(x.shape, at.get("axis", 1)))


def _b_unsqueeze(im, ins, at):
    x = im.tensor(ins[0])
    return im.b.reshape(x, unsqueeze_shape(x.shape, im.axes(ins, at, 0)))


def _b_squeeze(im, ins, at):
    x = im.tensor(ins[0])
    return im.b.reshape(x, squeeze_shape(x.shape, im.axes(ins, at, len(x.shape))))


def _b_dropout(im, ins, at):
    """Inference: the identity (training_mode, when given, must be false)."""
    training = im.opt(ins, 2, "training_mode")
    ratio = im.opt(ins, 1, "ratio")
    if training is not None and bool(np.asarray(training).reshape(-1)[0]) and (
            ratio is None or float(np.asarray(ratio).reshape(-1)[0]) != 0.0):
        raise NotImplementedError(f"node {im.label!r}: Dropout in training mode (random)")
    x = im.env[ins[0]]
    shape = x.shape if not isinstance(x, Known) else x.value.shape
    return [x, np.ones(shape, np.bool_)]


def _b_expand(im, ins, at):
    x = im.tensor(ins[0])
    shape = np.broadcast_shapes(x.shape, tuple(int(d) for d in im.known(ins[1], "the shape")))
    return x if tuple(shape) == x.shape else im.b.op("broadcast_to", x, shape=tuple(shape))


def slice_along(im, x, axis, start, step, count):
    rank = len(x.shape)
    if count == 0:  # an empty value: only Concat (which drops it) may read it
        return _empty(im, x.shape[:axis] + (0,) + x.shape[axis + 1:])
    if start == 0 and step == 1 and count == x.shape[axis]:
        return x
    starts, steps, shape = [0] * rank, [1] * rank, list(x.shape)
    starts[axis], steps[axis], shape[axis] = start, step if count > 1 else 1, count
    return im.b.slice(x, starts=tuple(starts), steps=tuple(steps), shape=tuple(shape))


def _empty(im, shape):
    """A tensor with no elements, as a known value: Concat drops it, other ops refuse it."""
    return Known(np.zeros(shape, np.float32), f"{im.node.output[0]}.empty")


def _b_gather(im, ins, at):
    b, x = im.b, im.tensor(ins[0])
    rank = len(x.shape)
    axis = int(at.get("axis", 0)) % rank
    d = x.shape[axis]
    iv = im.env[ins[1]]
    if isinstance(iv, Known):
        idx = np.asarray(iv.value).astype(np.int64)
        idx = np.where(idx < 0, idx + d, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= d):
            raise ValueError(f"node {im.label!r}: Gather index out of range for an axis of {d}")
        flat = idx.reshape(-1)
        step = int(flat[1] - flat[0]) if flat.size > 1 else 1
        if flat.size and step != 0 and np.array_equal(flat, flat[0] + step * np.arange(flat.size)):
            y = slice_along(im, x, axis, int(flat[0]), step, flat.size)  # a strided run: a slice
            return b.reshape(y, x.shape[:axis] + idx.shape + x.shape[axis + 1:])
        ids = b.constant_ids(idx)
    else:
        ids = im.tensor(ins[1])
        if ids.dtype != "i32":
            raise NotImplementedError(f"node {im.label!r}: Gather indices must be integers")
    return gather_axis(b, x, axis, ids)


def gather_axis(b, x, axis, ids):
    """x indexed along `axis` by the i32 tensor ids: the axis replaced by ids' axes."""
    if axis == 0:
        return b.gather(x, ids)
    rank = len(x.shape)
    perm = [axis] + [a for a in range(rank) if a != axis]
    y = b.gather(b.transpose(x, perm), ids)  # idx dims, then the other axes in order
    k = len(ids.shape)
    back = list(range(k, k + axis)) + list(range(k)) + list(range(k + axis, k + rank - 1))
    return b.transpose(y, back)


def _b_slice(im, ins, at):
    x = im.tensor(ins[0])
    rank = len(x.shape)
    if len(ins) > 1:
        starts, ends = as_ints(im.known(ins[1], "starts")), as_ints(im.known(ins[2], "ends"))
        axes = as_ints(im.opt(ins, 3, "axes")) if len(ins) > 3 and ins[3] else list(range(len(starts)))
        steps = as_ints(im.opt(ins, 4, "steps")) if len(ins) > 4 and ins[4] else [1] * len(starts)
    else:
        starts, ends = as_ints(at["starts"]), as_ints(at["ends"])
        axes, steps = as_ints(at.get("axes", range(len(starts)))), [1] * len(starts)
    st, sp, shape = [0] * rank, [1] * rank, list(x.shape)
    for s, e, a, p in zip(starts, ends, axes, steps):
        a %= rank
        r = range(x.shape[a])[slice(s, e, p)]  # ONNX clamps starts and ends as Python does
        if len(r) == 0:
            return _empty(im, x.shape[:a] + (0,) + x.shape[a + 1:])
        st[a], sp[a], shape[a] = r.start, r.step if len(r) > 1 else 1, len(r)
    if tuple(shape) == x.shape and all(p == 1 for p in sp):
        return x
    return im.b.slice(x, starts=tuple(st), steps=tuple(sp), shape=tuple(shape))


def _b_pad(im, ins, at):
    x = im.tensor(ins[0])
    rank = len(x.shape)
    mode = at.get("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise NotImplementedError(f"node {im.label!r}: Pad mode {mode!r}")
    pads = as_ints(im.known(ins[1], "pads") if len(ins) > 1 else at["pads"])
    value = im.opt(ins, 2, "constant_value")
    value = float(np.asarray(value).reshape(-1)[0]) if value is not None and np.asarray(value).size else float(
        at.get("value", 0.0))
    axes = [a % rank for a in as_ints(im.opt(ins, 3, "axes"))] if len(ins) > 3 and ins[3] else list(range(rank))
    lo, hi = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        lo[a], hi[a] = pads[i], pads[i + len(axes)]
    for a in range(rank):  # negative pads crop
        if lo[a] < 0 or hi[a] < 0:
            start, stop = max(-lo[a], 0), x.shape[a] - max(-hi[a], 0)
            x = slice_along(im, x, a, start, 1, max(stop - start, 0))
    lo, hi = [max(v, 0) for v in lo], [max(v, 0) for v in hi]
    if not any(lo) and not any(hi):
        return x
    if mode != "constant":
        return _pad_by_copies(im, x, lo, hi, mode)
    shape = tuple(d + p + q for d, p, q in zip(x.shape, lo, hi))
    return im.b.pad(x, starts=tuple(lo), steps=(1,) * rank, shape=shape, value=int(value) if x.dtype == "i32" else value)


def _pad_by_copies(im, x, lo, hi, mode):
    """reflect / edge / wrap padding: each padded axis read back at the source positions
    numpy.pad gives (a gather of constant ids; its gradient sums into the sources)."""
    for a, (p, q) in enumerate(zip(lo, hi)):
        if p or q:
            ids = np.pad(np.arange(x.shape[a]), (p, q), mode=mode)
            x = gather_axis(im.b, x, a, im.b.constant_ids(ids))
    return x


def _b_concat(im, ins, at):
    ts = []
    for n in ins:
        v = im.env[n]
        if not n or (isinstance(v, Known) and v.value.size == 0):
            continue
        ts.append(im.tensor(n))
    if not ts:
        raise NotImplementedError(f"node {im.label!r}: Concat of empty tensors")
    if len(ts) == 1:
        return ts[0]
    if len({t.dtype for t in ts}) != 1:
        raise NotImplementedError(f"node {im.label!r}: Concat of integer and float tensors")
    return im.b.concat(*ts, axis=int(at["axis"]) % len(ts[0].shape))


def _b_split(im, ins, at):
    x = im.tensor(ins[0])
    axis = int(at.get("axis", 0)) % len(x.shape)
    split = im.opt(ins, 1, "split")
    sizes = split_sizes(im, x.shape[axis], [None, split], at)
    outs, start = [], 0
    for n in sizes:
        outs.append(slice_along(im, x, axis, start, 1, n))
        start += n
    return outs


def _b_where(im, ins, at):
    v = im.env[ins[0]]
    if isinstance(v, Known):
        c = np.asarray(v.value).astype(bool)
        cond = im.b.const(float(c)) if c.ndim == 0 else im.b.constant(c.astype(np.float64))
    else:
        cond = im.mask_of(ins[0])
    x, y = im.env[ins[1]], im.env[ins[2]]
    ref = cond if isinstance(x, Known) and isinstance(y, Known) else None
    dtype = "i32" if ref is not None and x.value.dtype.kind in "iu" else None
    tx = im.operand(ins[1], ref or (y if not isinstance(y, Known) else x), dtype)
    ty = im.operand(ins[2], ref or tx, dtype)
    out = im.b.op("where", cond, tx, ty)
    if tx.id in im.masks and ty.id in im.masks:
        im.mask(out)
    return out


def _b_tile(im, ins, at):
    x = im.tensor(ins[0])
    reps = as_ints(im.known(ins[1], "repeats"))
    if all(r == 1 for r in reps):
        return x
    inter = tuple(v for d in x.shape for v in (1, d))
    wide = tuple(v for r, d in zip(reps, x.shape) for v in (r, d))
    y = im.b.op("broadcast_to", im.b.reshape(x, inter), shape=wide)
    return im.b.reshape(y, tuple(r * d for r, d in zip(reps, x.shape)))


def _b_depth_to_space(im, ins, at):
    b, x = im.b, im.tensor(ins[0])
    n, c, h, w = x.shape
    k = int(at["blocksize"])
    if at.get("mode", "DCR") == "DCR":
        y = b.transpose(b.reshape(x, (n, k, k, c // (k * k), h, w)), (0, 3, 4, 1, 5, 2))
    else:
        y = b.transpose(b.reshape(x, (n, c // (k * k), k, k, h, w)), (0, 1, 4, 2, 5, 3))
    return b.reshape(y, (n, c // (k * k), h * k, w * k))


def _b_space_to_depth(im, ins, at):
    b, x = im.b, im.tensor(ins[0])
    n, c, h, w = x.shape
    k = int(at["blocksize"])
    perm = (0, 3, 5, 1, 2, 4) if at.get("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    y = b.transpose(b.reshape(x, (n, c, h // k, k, w // k, k)), perm)
    return b.reshape(y, (n, c * k * k, h // k, w // k))


def _b_compress(im, ins, at):
    """The slices where a condition known at import holds: a gather of constant ids (the
    output's length depends on the condition, which must therefore be known)."""
    x = im.tensor(ins[0])
    cond = np.asarray(im.known(ins[1], "the condition (the output's length depends on it)")).reshape(-1)
    if "axis" not in at:
        x, axis = im.b.reshape(x, (int(np.prod(x.shape)),)), 0
    else:
        axis = int(at["axis"]) % len(x.shape)
    ids = np.flatnonzero(cond)
    if ids.size and ids[-1] >= x.shape[axis]:
        raise ValueError(f"node {im.label!r}: Compress condition of {cond.size} on an axis of {x.shape[axis]}")
    if ids.size == 0:
        return _empty(im, x.shape[:axis] + (0,) + x.shape[axis + 1:])
    return gather_axis(im.b, x, axis, im.b.constant_ids(ids))


def _b_reverse_sequence(im, ins, at):
    """Each batch item's first sequence_lens[i] time steps reversed: x viewed as
    [batch * time, ...] rows, gathered at constant ids (lengths known) or at ids computed in
    i32 from the lengths tensor."""
    b, x = im.b, im.tensor(ins[0])
    rank = len(x.shape)
    ba, ta = int(at.get("batch_axis", 1)) % rank, int(at.get("time_axis", 0)) % rank
    perm = [ba, ta] + [a for a in range(rank) if a not in (ba, ta)]
    nb, nt = x.shape[ba], x.shape[ta]
    rows = b.reshape(b.transpose(x, perm), (nb * nt,) + tuple(x.shape[a] for a in perm[2:]))
    t = np.arange(nt)[None, :]
    lv = im.env[ins[1]]
    if isinstance(lv, Known):
        lens = np.asarray(lv.value).astype(np.int64).reshape(nb, 1)
        ids = b.constant_ids(np.arange(nb)[:, None] * nt + np.where(t < lens, lens - 1 - t, t))
    else:
        lens = b.reshape(im.tensor(ins[1]), (nb, 1))
        tc = b.constant_ids(t)
        ids = b.op("where", b.op("greater", lens, tc), lens - b.const(1, "i32") - tc, tc)
        ids = ids + b.constant_ids(np.arange(nb)[:, None] * nt)
    y = b.reshape(b.gather(rows, ids), tuple(x.shape[a] for a in perm))
    return b.transpose(y, list(np.argsort(perm)))


BUILD_TENSOR = {
    "Identity": lambda im, ins, at: im.env[ins[0]],
    "Dropout": _b_dropout,
    "Reshape": _b_reshape,
    "Flatten": _b_flatten,
    "Transpose": lambda im, ins, at: im.b.transpose(im.tensor(ins[0]), at.get("perm")),
    "Unsqueeze": _b_unsqueeze,
    "Squeeze": _b_squeeze,
    "Expand": _b_expand,
    "Gather": _b_gather,
    "Slice": _b_slice,
    "Pad": _b_pad,
    "Concat": _b_concat,
    "Split": _b_split,
    "Where": _b_where,
    "Tile": _b_tile,
    "DepthToSpace": _b_depth_to_space,
    "SpaceToDepth": _b_space_to_depth,
    "Compress": _b_compress,
    "ReverseSequence": _b_reverse_sequence,
}

# ops that may read integer tensors (the others raise NotImplementedError on them)
INT_OK = frozenset({"Identity", "Dropout", "Reshape", "Flatten", "Transpose", "Unsqueeze", "Squeeze", "Expand",
                    "Gather", "Slice", "Split", "Tile", "Cast", "CastLike", "DepthToSpace", "SpaceToDepth",
                    "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss", "Attention", "RotaryEmbedding",
                    "Concat", "Pad", "Where", "Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Sum", "Neg", "Abs",
                    "Sign", "Relu", "Clip", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not",
                    "And", "Or", "Xor", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot",
                    "ArgMax", "ArgMin", "TopK", "ReduceSum", "ReduceMax", "ReduceMin", "Pow", "MaxPool",
                    "Compress", "ReverseSequence"})

# inputs that ops read as constants (shapes, axes, bounds): integer tensors there are
# not computed on; the builder asks for their value (and says it must be known)
PARAM_INPUTS = {"Resize": (1, 2, 3), "Upsample": (1,), "Reshape": (1,), "Expand": (1,), "Tile": (1,),
                "Pad": (1, 2, 3), "Slice": (1, 2, 3, 4), "Split": (1,), "Squeeze": (1,), "Unsqueeze": (1,),
                "Reduce": (1,), "Clip": (1, 2), "Dropout": (1, 2), "Pow": (1,), "CenterCropPad": (1,),
                "Compress": (1,), "ReverseSequence": (1,)}

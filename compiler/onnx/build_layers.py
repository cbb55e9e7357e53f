"""Graph builders for composite ONNX ops: RotaryEmbedding, the two classification losses,
LRN, LpPool, CenterCropPad, IsNaN / IsInf (attention: build_attention.py)."""
from __future__ import annotations

import numpy as np

from .build_nn import pool_builder
from .common import as_ints, Known


# ------------------------------------------------------------- rotary embedding
def _b_rotary(im, ins, at):
    """ONNX RotaryEmbedding on the `rope` row: halves (or interleaved pairs, moved into
    halves and back) of the first rotary_embedding_dim features of each head."""
    b, x = im.b, im.tensor(ins[0])
    shape = x.shape
    if len(shape) == 4:  # [B, H, S, D] -> [B, S, H, D]
        x = b.transpose(x, (0, 2, 1, 3))
    else:
        x = b.reshape(x, shape[:2] + (int(at["num_heads"]), shape[2] // int(at["num_heads"])))
    bs, s, h, d = x.shape
    r = int(at.get("rotary_embedding_dim", 0) or d)
    cos, sin = im.tensor(ins[1]), im.tensor(ins[2])
    if len(ins) > 3 and ins[3]:
        v = im.env[ins[3]]
        ids = b.constant_ids(np.asarray(v.value)) if isinstance(v, Known) else im.tensor(ins[3])
        cos, sin = b.gather(cos, ids), b.gather(sin, ids)
    cos, sin = (b.reshape(t, (bs, s, 1, r // 2)) for t in (cos, sin))
    cos, sin = (b.concat(t, t, axis=3) for t in (cos, sin))
    rot = b.slice(x, starts=(0,) * 4, steps=(1,) * 4, shape=(bs, s, h, r)) if r < d else x
    if at.get("interleaved", 0):
        halves = b.reshape(b.transpose(b.reshape(rot, (bs, s, h, r // 2, 2)), (0, 1, 2, 4, 3)), (bs, s, h, r))
        y = b.rope(halves, cos, sin)
        y = b.reshape(b.transpose(b.reshape(y, (bs, s, h, 2, r // 2)), (0, 1, 2, 4, 3)), (bs, s, h, r))
    else:
        y = b.rope(rot, cos, sin)
    if r < d:
        y = b.concat(y, b.slice(x, starts=(0, 0, 0, r), steps=(1,) * 4, shape=(bs, s, h, d - r)), axis=3)
    return b.transpose(y, (0, 2, 1, 3)) if len(shape) == 4 else b.reshape(y, shape)


# ------------------------------------------------------------------------ losses
def _nll(im, logp, target_name, weight_name, at):
    """Negative log-likelihood of log-probabilities [N, C, d...] at integer targets
    [N, d...], as ONNX: ignore_index and weights zero a position, mean divides by the
    total weight of the positions that count."""
    b = im.b
    target = im.tensor(target_name)
    if target.dtype != "i32":
        raise NotImplementedError(f"node {im.label!r}: loss targets must be integers")
    c = logp.shape[1]
    rank = len(logp.shape)
    onehot = b.one_hot(b.reshape(target, target.shape + (1,)), depth=c)  # [N, d..., C]
    moved = b.transpose(logp, (0,) + tuple(range(2, rank)) + (1,))
    picked = b.sum(moved * onehot, [rank - 1], False)
    if weight_name:
        w = b.sum(onehot * im.tensor(weight_name), [rank - 1], False)
    else:
        w = b.sum(onehot, [rank - 1], False)  # 0 where the target is out of range (ignored)
    if "ignore_index" in at and 0 <= int(at["ignore_index"]) < c:
        w = w * (1.0 - b.op("eq", b.op("cast", target, to="f32"), float(at["ignore_index"])))
    loss = -(picked * w)
    reduction = at.get("reduction", "mean")
    if reduction == "none":
        return loss
    total = b.sum(loss)
    if reduction == "sum":
        return total
    if not weight_name and "ignore_index" not in at:
        return total * (1.0 / max(1, int(np.prod(loss.shape))))
    return total / b.sum(w)


def _b_nll(im, ins, at):
    return _nll(im, im.tensor(ins[0]), ins[1], ins[2] if len(ins) > 2 else "", at)


def _b_sce(im, ins, at):
    x = im.tensor(ins[0])
    logp = im.b.log_softmax(x, 1)
    return [_nll(im, logp, ins[1], ins[2] if len(ins) > 2 else "", at), logp]


# ------------------------------------------------------------------ more layers
def _b_lrn(im, ins, at):
    """y = x / (bias + alpha / size * (sum of x^2 over `size` channels)) ^ beta."""
    b, x = im.b, im.tensor(ins[0])
    n, c = x.shape[:2]
    rest = int(np.prod(x.shape[2:]))
    size = int(at["size"])
    lo, hi = (size - 1) // 2, size // 2
    sq = b.reshape(x * x, (n, 1, c, rest))
    avg = b.avg_pool2d(sq, kernel=(size, 1), stride=(1, 1), padding=(lo, 0, hi, 0), count_include_pad=True)
    base = b.reshape(avg, x.shape) * float(at.get("alpha", 1e-4)) + float(at.get("bias", 1.0))
    return x * b.pow(base, -float(at.get("beta", 0.75)))


def _b_lp_pool(im, ins, at):
    """(sum of |x|^p over the window)^(1/p): the window's mean with padding counted,
    times the window size."""
    b, x = im.b, im.tensor(ins[0])
    p = int(at.get("p", 2))
    ax = b.op("maximum", x, -x)
    powered = ax * ax if p == 2 else b.pow(ax, float(p))
    name = f"{im.node.output[0]}.lp"
    im.env[name] = powered
    if at.get("ceil_mode", 0):
        raise NotImplementedError(f"node {im.label!r}: LpPool with ceil_mode")
    avg = pool_builder("avg")(im, [name], {**at, "count_include_pad": 1})  # zero padding: the window's sum / size
    total = avg * float(np.prod(as_ints(at["kernel_shape"])))
    return b.sqrt(total) if p == 2 else b.pow(total, 1.0 / p)


def _b_center_crop_pad(im, ins, at):
    from .build_tensor import slice_along

    b, x = im.b, im.tensor(ins[0])
    rank = len(x.shape)
    want = as_ints(im.known(ins[1], "the shape"))
    axes = [a % rank for a in as_ints(at.get("axes", range(rank)))]
    for a, n in zip(axes, want):
        d = x.shape[a]
        if n < d:
            x = slice_along(im, x, a, (d - n) // 2, 1, n)
        elif n > d:
            starts = tuple((n - d) // 2 if i == a else 0 for i in range(rank))
            x = b.pad(x, starts=starts, steps=(1,) * rank, shape=x.shape[:a] + (n,) + x.shape[a + 1:], value=0.0)
    return x


def _b_isnan(im, ins, at):
    x = im.tensor(ins[0])
    return im.mask(1.0 - im.b.op("eq", x, x))


def _b_isinf(im, ins, at):
    b, x = im.b, im.tensor(ins[0])
    pos, neg = int(at.get("detect_positive", 1)), int(at.get("detect_negative", 1))
    y = b.op("eq", x, float("inf")) if pos else None
    if neg:
        y = b.op("eq", x, float("-inf")) if y is None else y + b.op("eq", x, float("-inf"))
    return im.mask(y if y is not None else x * 0.0)


BUILD_LAYERS = {
    "RotaryEmbedding": _b_rotary,
    "NegativeLogLikelihoodLoss": _b_nll,
    "SoftmaxCrossEntropyLoss": _b_sce,
    "LRN": _b_lrn,
    "LpPool": _b_lp_pool,
    "CenterCropPad": _b_center_crop_pad,
    "IsNaN": _b_isnan,
    "IsInf": _b_isinf,
}

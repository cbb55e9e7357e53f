"""Op table rows for normalisation layers, attention, RoPE and resizing: all lower by
decomposition into the rows of ops.py and ops_nn.py, and differentiate through it."""
from __future__ import annotations

import math

import numpy as np

from .autodiff import grad_via_decomposition as _via
from .graph import Graph, Node
from .ops import row, same_shape

# ---------------------------------------------------------------- normalisation


def _mean(e, x, axes):
    xs = e.shape(x)
    count = int(np.prod([xs[a] for a in axes]))
    return e.scale(e.op("reduce_sum", x, axes=axes, keepdims=True), 1.0 / max(count, 1))


def _normalize(e, x, axes, eps):
    mu = _mean(e, x, axes)
    d = e.op("sub", x, mu)
    var = _mean(e, e.op("mul", d, d), axes)
    return e.op("mul", d, e.op("pow", e.op("add", var, e.const(eps)), exponent=-0.5))


def _ln_axes(at, rank):
    k = int(at.get("normalized_ndim", 1))
    return tuple(range(rank - k, rank))


def _d_layer_norm(e, n):
    x = n.inputs[0]
    y = _normalize(e, x, _ln_axes(dict(n.attrs), len(e.shape(x))), n.attr("eps", 1e-5))
    if len(n.inputs) > 1:
        y = e.op("mul", y, n.inputs[1])
    if len(n.inputs) > 2:
        y = e.op("add", y, n.inputs[2])
    return y


def _layer_norm_ref(xs, at):
    x = xs[0]
    axes = _ln_axes(at, x.ndim)
    mu = x.mean(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=axes, keepdims=True) + at.get("eps", 1e-5))
    return y * xs[1] + xs[2] if len(xs) > 2 else (y * xs[1] if len(xs) > 1 else y)


def _d_rms_norm(e, n):
    x = n.inputs[0]
    axes = _ln_axes(dict(n.attrs), len(e.shape(x)))
    ms = _mean(e, e.op("mul", x, x), axes)
    y = e.op("mul", x, e.op("pow", e.op("add", ms, e.const(n.attr("eps", 1e-6))), exponent=-0.5))
    return e.op("mul", y, n.inputs[1]) if len(n.inputs) > 1 else y


def _rms_norm_ref(xs, at):
    x = xs[0]
    axes = _ln_axes(at, x.ndim)
    y = x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + at.get("eps", 1e-6))
    return y * xs[1] if len(xs) > 1 else y


def _channel_param(e, p, rank):
    """A per-channel [C] parameter shaped to broadcast over [N, C, ...]."""
    return e.reshape(p, (e.shape(p)[0],) + (1,) * (rank - 2))


def _d_group_norm(e, n):
    x = n.inputs[0]
    xs = e.shape(x)
    groups = int(n.attr("groups"))
    xg = e.reshape(x, (xs[0], groups, int(np.prod(xs[1:])) // groups))
    y = e.reshape(_normalize(e, xg, (2,), n.attr("eps", 1e-5)), xs)
    if len(n.inputs) > 1:
        y = e.op("mul", y, _channel_param(e, n.inputs[1], len(xs)))
        y = e.op("add", y, _channel_param(e, n.inputs[2], len(xs)))
    return y


def _group_norm_ref(xs, at):
    x = xs[0]
    g = int(at["groups"])
    xg = x.reshape(x.shape[0], g, -1)
    mu = xg.mean(axis=2, keepdims=True)
    y = ((xg - mu) / np.sqrt(((xg - mu) ** 2).mean(axis=2, keepdims=True) + at.get("eps", 1e-5))).reshape(x.shape)
    if len(xs) > 1:
        shape = (1, -1) + (1,) * (x.ndim - 2)
        y = y * xs[1].reshape(shape) + xs[2].reshape(shape)
    return y


def batch_statistics(e, x):
    """(axes, count, mean, x - mean, sum of its squares), keepdims, over every axis but the
    channels': batch norm's forward, its gradient and the training step's running statistics
    all build them here, so that prepare() merges them into one pair of reductions (built
    apart, they would be computed again and keep each input alive to the step's end)."""
    xs = e.shape(x)
    axes = tuple(a for a in range(len(xs)) if a != 1)
    count = math.prod(xs[a] for a in axes)
    mean = _mean(e, x, axes)
    d = e.op("sub", x, mean)
    return axes, count, mean, d, e.op("reduce_sum", e.op("mul", d, d), axes=axes, keepdims=True)


def _batch_normalized(e, x, eps):
    """(axes, count, 1 / std, the normalised x) with the batch's statistics."""
    axes, count, _, d, squares = batch_statistics(e, x)
    invstd = e.op("pow", e.op("add", e.scale(squares, 1.0 / max(count, 1)), e.const(eps)), exponent=-0.5)
    return axes, count, invstd, e.op("mul", d, invstd)


def _d_batch_norm(e, n):
    """Inputs x, weight, bias, running_mean, running_var. In training mode the batch's
    statistics normalise (the training graph also updates the running ones)."""
    x, w, b, rm, rv = n.inputs
    rank = len(e.shape(x))
    eps = n.attr("eps", 1e-5)
    if n.attr("training"):
        y = _batch_normalized(e, x, eps)[3]
    else:
        scale = e.op("pow", e.op("add", rv, e.const(eps)), exponent=-0.5)
        y = e.op("mul", e.op("sub", x, _channel_param(e, rm, rank)), _channel_param(e, scale, rank))
    return e.op("add", e.op("mul", y, _channel_param(e, w, rank)), _channel_param(e, b, rank))


def _g_batch_norm(e, n, i, g):
    """In training mode the closed form: with xhat = (x - mean) * invstd and y = xhat * w + b,
    dx = w * invstd * (g - sum(g) / count - xhat * sum(g * xhat) / count), whose two sums are
    the bias's and the weight's gradients. Differentiating the decomposition would take four
    reductions (each two kernels over NCHW's scattered axes) where these take two. The
    forward's own nodes (mean, xhat) are re-emitted and merged with it by prepare()."""
    if not n.attr("training"):
        return _via(e, n, i, g)
    x, w, _, _, _ = n.inputs
    rank = len(e.shape(x))
    axes, count, invstd, xhat = _batch_normalized(e, x, n.attr("eps", 1e-5))
    gb = e.op("reduce_sum", g, axes=axes, keepdims=True)
    gw = e.op("reduce_sum", e.op("mul", g, xhat), axes=axes, keepdims=True)
    centered = e.op("sub", e.op("sub", g, e.scale(gb, 1.0 / count)), e.op("mul", xhat, e.scale(gw, 1.0 / count)))
    gx = e.op("mul", e.op("mul", _channel_param(e, w, rank), invstd), centered)
    c = e.shape(x)[1]
    return [gx, e.reshape(gw, (c,)), e.reshape(gb, (c,)), None, None]


def _batch_norm_ref(xs, at):
    x, w, b, rm, rv = xs
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if at.get("training"):
        axes = tuple(a for a in range(x.ndim) if a != 1)
        rm = x.mean(axis=axes)
        rv = x.var(axis=axes)
    y = (x - rm.reshape(shape)) / np.sqrt(rv.reshape(shape) + at.get("eps", 1e-5))
    return y * w.reshape(shape) + b.reshape(shape)


# one row kernel forward; the gradient differentiates the decomposition (third item)
row("layer_norm", same_shape, _layer_norm_ref, _via, ("kernel", "norm", _d_layer_norm))
row("rms_norm", same_shape, _rms_norm_ref, _via, ("kernel", "norm", _d_rms_norm))
row("group_norm", same_shape, _group_norm_ref, _via, ("decompose", _d_group_norm))
row("batch_norm", same_shape, _batch_norm_ref, _g_batch_norm, ("decompose", _d_batch_norm))

# -------------------------------------------------------------------- attention


def _attention_shape(nodes, at):
    q, k, v = nodes[0].shape, nodes[1].shape, nodes[2].shape
    assert len(q) == len(k) == len(v) == 4, "attention takes q, k, v as [batch, heads, tokens, dim]"
    assert k == v[:3] + (k[3],) and q[0] == k[0] and q[3] == k[3], f"q {q}, k {k}, v {v} do not fit"
    assert q[1] % k[1] == 0, f"{q[1]} query heads do not group over {k[1]} key/value heads"
    if len(nodes) > 3:
        np.broadcast_shapes(nodes[3].shape, (q[0], q[1], q[2], k[2]))
    return "f32", q[:3] + (v[3],)


def attention_scale(at, d):
    s = at.get("scale")
    return float(s) if s is not None else 1.0 / math.sqrt(d)


def _causal_mask(s, t):
    """Query i sees keys up to i + (t - s): the last query sees every key."""
    return np.where(np.arange(t)[None, :] <= np.arange(s)[:, None] + (t - s), 0.0, -np.inf)


def _scores_ref(xs, at):
    """Scaled, masked scores [b, hq, s, t], with k and v repeated over each query group."""
    q, k, v = xs[:3]
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ np.swapaxes(k, -1, -2) * attention_scale(at, q.shape[-1])
    if at.get("causal"):
        s = s + _causal_mask(q.shape[2], k.shape[2])
    if len(xs) > 3:
        s = s + xs[3]
    return s, k, v


def _attention_ref(xs, at):
    s, _, v = _scores_ref(xs, at)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    return (s / s.sum(axis=-1, keepdims=True)) @ v


def _d_scores(e, n):
    """Scores as [b, hk, rep * s, t]: grouped-query heads share a key/value head without
    copies, the queries of one group stacked as extra rows of one matmul."""
    q, k = n.inputs[:2]
    b, hq, s, d = e.shape(q)
    hk, t = e.shape(k)[1], e.shape(k)[2]
    rep = hq // hk
    qg = e.reshape(q, (b, hk, rep * s, d))
    scores = e.scale(e.op("matmul", qg, k, trans_b=True), attention_scale(dict(n.attrs), d))
    scores = e.reshape(scores, (b, hk, rep, s, t))
    if n.attr("causal"):
        scores = e.op("add", scores, e.constant(_causal_mask(s, t)))
    if len(n.inputs) > 3:
        mask = n.inputs[3]
        ms = (1,) * (4 - len(e.shape(mask))) + e.shape(mask)
        mask = e.reshape(mask, ms)
        mk = ms[1]
        mask = e.reshape(mask, (ms[0], hk if mk != 1 else 1, rep if mk != 1 else 1, ms[2], ms[3]))
        scores = e.op("add", scores, mask)
    return e.reshape(scores, (b, hk, rep * s, t))


def _d_attention(e, n):
    q, v = n.inputs[0], n.inputs[2]
    b, hq, s, _ = e.shape(q)
    out = e.op("matmul", e.op("softmax", _d_scores(e, n)), v)
    return e.reshape(out, (b, hq, s, e.shape(v)[3]))


# An attention's gradient holds its [batch, heads, queries, keys] scores in memory (the
# decomposition's gradient: GEMMs and a softmax) when they take at most SCORES_IN_MEMORY_MAX
# bytes, or at most SCORES_PARAM_SHARE of the graph's parameter bytes (a training step holds
# four times those anyway: weights, gradients, AdamW's two moments); past both, the fused
# kernels recompute them block by block and never hold them. The decomposition is the faster
# of the two at every size measured, but the rule is per attention and the scheduler may hold
# several layers' scores at once: past these limits the memory costs more than the time saved
# (bench/REJECTED.md: attention backward: 16-byte loads, 48 KiB blocks).
SCORES_IN_MEMORY_MAX = 16 << 20
SCORES_PARAM_SHARE = 0.25


def _scores_in_memory(g, scores_bytes: int) -> bool:
    if scores_bytes <= SCORES_IN_MEMORY_MAX:
        return True
    param_bytes = 4 * sum(g.nodes[i].size for i in g.by_op.get("param", {}).values())
    return scores_bytes <= SCORES_PARAM_SHARE * param_bytes


def attention_fits_fused(n: Node, g: Graph) -> bool:
    """The fused attention kernel covers: no extra mask, equal query and value head dims of
    4k up to 256, and a causal mask only when every query sees at least one key."""
    q, k, v = (g.nodes[i].shape for i in n.inputs[:3])
    d = q[3]
    return len(n.inputs) == 3 and d % 4 == 0 and d <= 256 and v[3] == d and not (n.attr("causal") and k[2] < q[2])


def _g_attention(e, n, i, g):
    """Small attentions differentiate the decomposition (see SCORES_IN_MEMORY_MAX); where the
    fused forward runs on larger ones, the fused backward does too: the forward kernel also
    writes each row's log-sum-exp, and attention_grad rows (dQ and dK/dV kernels, see
    codegen/attention.py) recompute the probabilities from it, block by block, never
    [tokens x tokens] in memory.
    Elsewhere (an extra mask, odd head dims) the decomposition is differentiated."""
    (b, h, s, d), t = e.shape(n.inputs[0]), e.shape(n.inputs[1])[2]
    if not (attention_fits_fused(n, e.g) and backward_blocks(d)) or _scores_in_memory(e.g, b * h * s * t * 4):
        return _via(e, n, i, g)
    q, k, v = n.inputs
    lse = e.op("attention_lse", q, k, v, **dict(n.attrs))
    return [e.op("attention_grad", q, k, v, i, g, lse, wrt=w, **dict(n.attrs)) for w in range(3)]


# workgroup memory the fused backward's blocks may use: 32 KiB is lavapipe's, Apple's and most
# mobile GPUs' limit (the kernels are chosen offline, so every device gets these)
BACKWARD_BUDGET = 32768


def backward_blocks(d: int, budget: int | None = None):
    """Block sizes (dQ kernel: queries, keys; dK/dV kernel: keys, queries) whose workgroup
    tiles fit `budget` bytes (default BACKWARD_BUDGET), largest first, or None: then the
    decomposition's gradient runs."""
    budget = BACKWARD_BUDGET if budget is None else budget
    stride = d // 4 + 1  # vec4s per tile row, padded by one: no bank conflicts across rows
    sizes = ((32, 32), (32, 16), (16, 16), (16, 8), (8, 8))
    dq = next(((a, c) for a, c in sizes if 4 * (8 * stride * (a + c) + a * c + 2 * a) <= budget), None)
    dkv = next(((a, c) for a, c in sizes if 4 * (8 * stride * (a + c) + 2 * a * c) <= budget), None)
    return (dq, dkv) if dq and dkv else None


def _attention_lse_shape(nodes, at):
    return "f32", _attention_shape(nodes, at)[1][:3]


def _attention_lse_ref(xs, at):
    s, _, _ = _scores_ref(xs, at)
    m = s.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True)))[..., 0]


def _d_attention_lse(e, n):
    s = _d_scores(e, n)
    m = e.op("reduce_max", s, axes=(-1,), keepdims=True)
    lse = e.op("add", e.op("log", e.op("reduce_sum", e.op("exp", e.op("sub", s, m)), axes=(-1,), keepdims=True)), m)
    return e.reshape(lse, n.shape)


def _attention_grad_shape(nodes, at):
    _, out = _attention_shape(nodes[:3], at)
    assert nodes[3].shape == nodes[4].shape == out, f"o {nodes[3].shape} and do {nodes[4].shape} must be {out}"
    assert nodes[5].shape == out[:3], f"the log-sum-exp {nodes[5].shape} must be {out[:3]}"
    return "f32", nodes[int(at["wrt"])].shape


def _attention_grad_ref(xs, at):
    """d sum(attention(q, k, v) * do) / d (q, k or v: input `wrt`); o and lse (the forward's
    outputs, which the kernel reads) are recomputed here."""
    q, k, _, _, do, _ = xs
    s, kr, vr = _scores_ref(xs[:3], at)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    dp = do @ np.swapaxes(vr, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    scale = attention_scale(at, q.shape[-1])
    w = int(at["wrt"])
    if w == 0:
        return ds @ kr * scale
    full = np.swapaxes(ds, -1, -2) @ q * scale if w == 1 else np.swapaxes(p, -1, -2) @ do
    b, hk = k.shape[:2]
    return full.reshape(b, hk, q.shape[1] // hk, *full.shape[2:]).sum(axis=2)  # a group shares k and v


def _d_attention_grad(e, n):
    """The gradient by differentiating attention's decomposition: the reference path, and
    what this op's own gradient (second order) differentiates in turn."""
    from .autodiff import vjp

    q, k, v, o, do, _ = n.inputs
    ins = [q, k, v]
    if len(set(ins)) < 3:  # one node in two roles: proxies keep the roles' gradients apart
        ins = [e.op("broadcast_to", x, shape=e.shape(x)) for x in ins]
    fwd = Node("attention", "f32", e.shape(o), tuple(ins), tuple(a for a in n.attrs if a[0] != "wrt"))
    grads = vjp(e, _d_attention(e, fwd), do, ins)
    return grads[ins[int(n.attr("wrt"))]]


# one fused kernel forward (prepare() decomposes the cases it does not cover); the gradient
# is two fused kernels where the forward is fused, else it differentiates the decomposition
row("attention", _attention_shape, _attention_ref, _g_attention, ("kernel", "attention", _d_attention))
# the forward's second output, attention's gradient: kernels of the "attention" family;
# each also decomposes, which their own gradients differentiate
row("attention_lse", _attention_lse_shape, _attention_lse_ref, _via, ("kernel", "attention", _d_attention_lse))
row("attention_grad", _attention_grad_shape, _attention_grad_ref, _via, ("kernel", "attention", _d_attention_grad))


def _rope_shape(nodes, at):
    x, c, s = (n.shape for n in nodes)
    assert x[-1] % 2 == 0, "RoPE needs an even head dimension"
    assert c == s and np.broadcast_shapes(x, c) == x, f"cos/sin {c} do not broadcast over {x}"
    return "f32", x


def _rope_ref(xs, at):
    x, c, s = xs
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * c + rot * s


def _d_rope(e, n):
    """x * cos + rotate_half(x) * sin, with rotate_half as two slices placed by pads."""
    x, c, s = n.inputs
    shape = e.shape(x)
    h = shape[-1] // 2
    rank = len(shape)
    half = shape[:-1] + (h,)
    ones = (1,) * rank
    zeros = (0,) * rank
    first = e.op("slice", x, starts=zeros, steps=ones, shape=half)
    second = e.op("slice", x, starts=zeros[:-1] + (h,), steps=ones, shape=half)
    rot = e.op("add", e.op("pad", e.op("neg", second), starts=zeros, steps=ones, shape=shape, value=0.0),
               e.op("pad", first, starts=zeros[:-1] + (h,), steps=ones, shape=shape, value=0.0))
    return e.op("add", e.op("mul", x, c), e.op("mul", rot, s))


row("rope", _rope_shape, _rope_ref, _via, ("decompose", _d_rope))

# ----------------------------------------------------------------------- resize


def resize_matrix(n_in: int, n_out: int, mode: str, transform: str = "half_pixel", cubic_a: float = -0.75,
                  nearest_mode: str = "round_prefer_floor", scale: float | None = None) -> np.ndarray:
    """[n_out, n_in] interpolation weights along one axis, with ONNX Resize's meanings.

    `scale` (output / input), when given, replaces n_out / n_in in the coordinate
    mapping, as torch does for interpolate(scale_factor=...)."""
    sc = float(scale) if scale else n_out / n_in
    o = np.arange(n_out, dtype=np.float64)
    if transform == "align_corners":
        src = o * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(n_out)
    elif transform == "asymmetric":
        src = o / sc
    elif transform == "pytorch_half_pixel":
        src = (o + 0.5) / sc - 0.5 if n_out > 1 else np.zeros(n_out)
    elif transform == "half_pixel":
        src = (o + 0.5) / sc - 0.5
    else:
        raise NotImplementedError(f"resize coordinate transformation {transform!r}")
    m = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    if mode == "nearest":
        if nearest_mode == "floor":
            idx = np.floor(src)
        elif nearest_mode == "ceil":
            idx = np.ceil(src)
        elif nearest_mode == "round_prefer_ceil":
            idx = np.floor(src + 0.5)
        else:  # round_prefer_floor
            idx = np.ceil(src - 0.5)
        m[rows, np.clip(idx, 0, n_in - 1).astype(int)] = 1.0
    elif mode == "linear":
        src = np.maximum(src, 0.0) if transform != "align_corners" else src
        i0 = np.clip(np.floor(src).astype(int), 0, n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        w1 = np.clip(src - i0, 0.0, 1.0)
        np.add.at(m, (rows, i0), 1 - w1)
        np.add.at(m, (rows, i1), w1)
    elif mode == "cubic":
        i0 = np.floor(src).astype(int)
        t = src - i0
        a = cubic_a

        def w(x):
            x = np.abs(x)
            return np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                            np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0))

        for tap in range(-1, 3):
            np.add.at(m, (rows, np.clip(i0 + tap, 0, n_in - 1)), w(t - tap))
    else:
        raise NotImplementedError(f"resize mode {mode!r}")
    return m


def _resize_matrices(at, h, w):
    kw = dict(mode=at.get("mode", "linear"), transform=at.get("transform", "half_pixel"),
              cubic_a=at.get("cubic_a", -0.75), nearest_mode=at.get("nearest_mode", "round_prefer_floor"))
    scales = at.get("scales") or (None, None)
    ho, wo = at["size"]
    return resize_matrix(h, ho, scale=scales[0], **kw), resize_matrix(w, wo, scale=scales[1], **kw)


def _resize_shape(nodes, at):
    x = nodes[0].shape
    assert len(x) >= 2, "resize works on the last two axes"
    return "f32", x[:-2] + tuple(int(s) for s in at["size"])


def _resize_ref(xs, at):
    x = xs[0]
    rh, rw = _resize_matrices(at, x.shape[-2], x.shape[-1])
    return np.matmul(rh.astype(x.dtype), np.matmul(x, rw.T.astype(x.dtype)))


def _d_resize(e, n):
    """Separable interpolation as two matmuls with constant weight matrices: exact for
    nearest, bilinear and bicubic, and the backward pass is the transposed matmuls."""
    x = n.inputs[0]
    h, w = e.shape(x)[-2:]
    rh, rw = _resize_matrices(dict(n.attrs), h, w)
    y = x
    if not (rw.shape[0] == rw.shape[1] and np.array_equal(rw, np.eye(w))):
        y = e.op("matmul", y, e.constant(rw), trans_b=True)
    if not (rh.shape[0] == rh.shape[1] and np.array_equal(rh, np.eye(h))):
        y = e.op("matmul", e.constant(rh), y)
    return y if y != x else e.op("broadcast_to", x, shape=e.shape(x))


row("resize", _resize_shape, _resize_ref, _via, ("decompose", _d_resize))

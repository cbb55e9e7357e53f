"""Op table rows for neural-network layers: convolution, pooling, embedding, activations.

Also tensor plumbing (slice, pad, concat, where); normalisation, attention and resizing are
in ops_layers.py. Same contract as ops.py (each op one row: shape rule, numpy reference,
gradient rule, lowering). Layers that are sums and products of simpler rows lower by
decomposition, and their gradient is the decomposition's gradient.
"""
from __future__ import annotations


import numpy as np

from .autodiff import grad_via_decomposition as _via
from .ops import EW, NOT_DIFFERENTIABLE, broadcast_shape, same_shape, row

# ------------------------------------------------------------------ convolution


def conv_out(size, k, stride, pad_lo, pad_hi, dil, ceil_mode=False):
    span = size + pad_lo + pad_hi - dil * (k - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_lo:  # the last window must start inside
        out -= 1
    return out


def conv_attrs(at):
    s = tuple(at.get("stride", (1, 1)))
    p = tuple(at.get("padding", (0, 0, 0, 0)))  # top, left, bottom, right
    d = tuple(at.get("dilation", (1, 1)))
    return s, p, d, int(at.get("groups", 1))


def _conv2d_shape(nodes, at):
    x, w = nodes[0].shape, nodes[1].shape
    assert len(x) == 4 and len(w) == 4, "conv2d takes x [N, C, H, W] and weight [O, C/groups, kh, kw]"
    s, p, d, g = conv_attrs(at)
    assert x[1] == w[1] * g and w[0] % g == 0, f"channels: input {x[1]}, weight {w}, groups {g}"
    ho = conv_out(x[2], w[2], s[0], p[0], p[2], d[0])
    wo = conv_out(x[3], w[3], s[1], p[1], p[3], d[1])
    assert ho > 0 and wo > 0, "the kernel is larger than the padded input"
    return "f32", (x[0], w[0], ho, wo)


def _convT_shape(nodes, at):
    x, w = nodes[0].shape, nodes[1].shape
    assert len(x) == 4 and len(w) == 4, "conv_transpose2d takes x [N, C, H, W] and weight [C, O/groups, kh, kw]"
    s, p, d, g = conv_attrs(at)
    op = tuple(at.get("output_padding", (0, 0)))
    assert x[1] == w[0] and w[0] % g == 0, f"channels: input {x[1]}, weight {w}, groups {g}"
    ho = (x[2] - 1) * s[0] - p[0] - p[2] + d[0] * (w[2] - 1) + op[0] + 1
    wo = (x[3] - 1) * s[1] - p[1] - p[3] + d[1] * (w[3] - 1) + op[1] + 1
    return "f32", (x[0], w[1] * g, ho, wo)


def _conv_wgrad_shape(nodes, at):
    x, gy = nodes[0].shape, nodes[1].shape
    _, _, _, g = conv_attrs(at)
    kh, kw = at["kernel"]
    return "f32", (gy[1], x[1] // g, kh, kw)


def _windows(x, kh, kw, s, p, d, ho, wo, fill=0.0):
    """x [N, C, H, W] -> [N, C, ho, wo, kh, kw] of input windows (padded with `fill`)."""
    n, c, h, w = x.shape
    big_h = max(h + p[0] + p[2], (ho - 1) * s[0] + d[0] * (kh - 1) + 1)
    big_w = max(w + p[1] + p[3], (wo - 1) * s[1] + d[1] * (kw - 1) + 1)
    xp = np.full((n, c, big_h, big_w), fill, dtype=x.dtype)
    xp[:, :, p[0]:p[0] + h, p[1]:p[1] + w] = x
    out = np.empty((n, c, ho, wo, kh, kw), dtype=x.dtype)
    for ky in range(kh):
        for kx in range(kw):
            ys, xs = ky * d[0], kx * d[1]
            out[..., ky, kx] = xp[:, :, ys:ys + (ho - 1) * s[0] + 1:s[0], xs:xs + (wo - 1) * s[1] + 1:s[1]]
    return out


def _conv2d_ref(xs, at):
    x, w = xs
    s, p, d, g = conv_attrs(at)
    o, cg, kh, kw = w.shape
    _, (n, _, ho, wo) = _conv2d_shape([_Shape(x), _Shape(w)], at)
    win = _windows(x, kh, kw, s, p, d, ho, wo).reshape(n, g, cg, ho, wo, kh, kw)
    wg = w.reshape(g, o // g, cg, kh, kw)
    y = np.einsum("ngchwyx,gocyx->ngohw", win, wg, optimize=True)
    return y.reshape(n, o, ho, wo)


def _convT_ref(xs, at):
    """Scatter form: every input pixel adds weight * value into its output window."""
    x, w = xs
    s, p, d, g = conv_attrs(at)
    _, shape = _convT_shape([_Shape(x), _Shape(w)], at)
    n, c, h, wd = x.shape
    cin_g, og, kh, kw = c // g, w.shape[1], w.shape[2], w.shape[3]
    full_h = (h - 1) * s[0] + d[0] * (kh - 1) + 1 + shape[2]
    full_w = (wd - 1) * s[1] + d[1] * (kw - 1) + 1 + shape[3]
    out = np.zeros((n, g * og, full_h, full_w), dtype=np.result_type(x, w))
    xg = x.reshape(n, g, cin_g, h, wd)
    wg = w.reshape(g, cin_g, og, kh, kw)
    for ky in range(kh):
        for kx in range(kw):
            contrib = np.einsum("ngchw,gco->ngohw", xg, wg[..., ky, kx], optimize=True).reshape(n, g * og, h, wd)
            ys, xs_ = ky * d[0], kx * d[1]
            out[:, :, ys:ys + (h - 1) * s[0] + 1:s[0], xs_:xs_ + (wd - 1) * s[1] + 1:s[1]] += contrib
    return out[:, :, p[0]:p[0] + shape[2], p[1]:p[1] + shape[3]]


def _conv_wgrad_ref(xs, at):
    x, gy = xs
    s, p, d, g = conv_attrs(at)
    kh, kw = at["kernel"]
    n, o, ho, wo = gy.shape
    cg = x.shape[1] // g
    win = _windows(x, kh, kw, s, p, d, ho, wo).reshape(n, g, cg, ho, wo, kh, kw)
    gyg = gy.reshape(n, g, o // g, ho, wo)
    return np.einsum("ngchwyx,ngohw->gocyx", win, gyg, optimize=True).reshape(o, cg, kh, kw)


class _Shape:  # lets reference code reuse the shape rules
    def __init__(self, a):
        self.shape, self.dtype = a.shape, "f32"


def _output_padding(in_size, out_size, k, s, p_lo, p_hi, d):
    return in_size - ((out_size - 1) * s - p_lo - p_hi + d * (k - 1) + 1)


def _g_conv2d(e, n, i, g):
    x, w = n.inputs
    at = dict(n.attrs)
    xs, ws = e.shape(x), e.shape(w)
    s, p, d, _ = conv_attrs(at)
    op = (_output_padding(xs[2], n.shape[2], ws[2], s[0], p[0], p[2], d[0]),
          _output_padding(xs[3], n.shape[3], ws[3], s[1], p[1], p[3], d[1]))
    gx = e.op("conv_transpose2d", g, w, **at, output_padding=op)
    gw = e.op("conv2d_weight_grad", x, g, **at, kernel=(ws[2], ws[3]))
    return [gx, gw]


def _g_convT(e, n, i, g):
    x, w = n.inputs
    at = {k: v for k, v in n.attrs if k != "output_padding"}
    gx = e.op("conv2d", g, w, **at)
    ws = e.shape(w)
    gw = e.op("conv2d_weight_grad", g, x, **at, kernel=(ws[2], ws[3]))
    return [gx, gw]


row("conv2d", _conv2d_shape, _conv2d_ref, _g_conv2d, ("kernel", "conv"))
row("conv_transpose2d", _convT_shape, _convT_ref, _g_convT, ("kernel", "conv"))
row("conv2d_weight_grad", _conv_wgrad_shape, _conv_wgrad_ref, None, ("kernel", "conv"))
NOT_DIFFERENTIABLE.add("conv2d_weight_grad")

# ---------------------------------------------------------------------- pooling


def pool_attrs(at):
    kh, kw = at["kernel"]
    s = tuple(at.get("stride", (kh, kw)))
    p = tuple(at.get("padding", (0, 0, 0, 0)))
    d = tuple(at.get("dilation", (1, 1)))
    return kh, kw, s, p, d, bool(at.get("ceil_mode", False))


def _pool_shape(nodes, at):
    x = nodes[0].shape
    assert len(x) == 4, "pooling takes x [N, C, H, W]"
    kh, kw, s, p, d, ceil = pool_attrs(at)
    assert d == (1, 1) or "count_include_pad" not in at and not at.get("average"), "average pooling has no dilation"
    ho = conv_out(x[2], kh, s[0], p[0], p[2], d[0], ceil)
    wo = conv_out(x[3], kw, s[1], p[1], p[3], d[1], ceil)
    assert ho > 0 and wo > 0, "the pooling window is larger than the padded input"
    return "f32", (x[0], x[1], ho, wo)


def _pool_grad_shape(nodes, at):
    return "f32", nodes[0].shape


def _maxpool_ref(xs, at):
    kh, kw, s, p, d, _ = pool_attrs(at)
    _, shape = _pool_shape([_Shape(xs[0])], at)
    return _windows(xs[0], kh, kw, s, p, d, shape[2], shape[3], -np.inf).max(axis=(4, 5))


def _maxpool_grad_ref(xs, at):
    """Each output's gradient goes to the first maximum of its window, as in PyTorch."""
    x, g = xs
    kh, kw, s, p, d, _ = pool_attrs(at)
    n, c, ho, wo = g.shape
    win = _windows(x, kh, kw, s, p, d, ho, wo, -np.inf).reshape(n, c, ho, wo, kh * kw)
    arg = win.argmax(axis=-1)
    ky, kx = arg // kw, arg % kw
    iy = np.arange(ho)[:, None] * s[0] - p[0] + ky * d[0]
    ix = np.arange(wo)[None, :] * s[1] - p[1] + kx * d[1]
    out = np.zeros_like(x)
    nn_, cc = np.meshgrid(np.arange(n), np.arange(c), indexing="ij")
    for oy in range(ho):
        for ox in range(wo):
            np.add.at(out, (nn_, cc, iy[:, :, oy, ox], ix[:, :, oy, ox]), g[:, :, oy, ox])
    return out


def _avg_divisor(h, w, at):
    """[ho, wo] divisors with PyTorch's rules for padding and ceil mode."""
    kh, kw, s, p, d, _ = pool_attrs(at)
    include = bool(at.get("count_include_pad", True))
    _, (_, _, ho, wo) = _pool_shape([_ShapeT((1, 1, h, w))], at)
    out = np.zeros((ho, wo))
    for oy in range(ho):
        for ox in range(wo):
            y0, x0 = oy * s[0] - p[0], ox * s[1] - p[1]
            y1, x1 = min(y0 + kh, h + p[2]), min(x0 + kw, w + p[3])
            pool = (y1 - y0) * (x1 - x0)
            y0c, x0c, y1c, x1c = max(y0, 0), max(x0, 0), min(y1, h), min(x1, w)
            out[oy, ox] = pool if include else (y1c - y0c) * (x1c - x0c)
    return out


class _ShapeT:
    def __init__(self, shape):
        self.shape, self.dtype = shape, "f32"


def _avgpool_ref(xs, at):
    kh, kw, s, p, d, _ = pool_attrs(at)
    x = xs[0]
    _, shape = _pool_shape([_Shape(x)], at)
    total = _windows(x, kh, kw, s, p, (1, 1), shape[2], shape[3]).sum(axis=(4, 5))
    return total / _avg_divisor(x.shape[2], x.shape[3], at).astype(x.dtype)


def _avgpool_grad_ref(xs, at):
    x, g = xs
    kh, kw, s, p, _, _ = pool_attrs(at)
    div = _avg_divisor(x.shape[2], x.shape[3], at).astype(g.dtype)
    gd = g / div
    n, c, h, w = x.shape
    big = np.zeros((n, c, h + p[0] + p[2] + kh + (g.shape[2]) * s[0], w + p[1] + p[3] + kw + g.shape[3] * s[1]),
                   dtype=g.dtype)
    for ky in range(kh):
        for kx in range(kw):
            big[:, :, ky:ky + (g.shape[2] - 1) * s[0] + 1:s[0], kx:kx + (g.shape[3] - 1) * s[1] + 1:s[1]] += gd
    return big[:, :, p[0]:p[0] + h, p[1]:p[1] + w]


row("max_pool2d", _pool_shape, _maxpool_ref,
    lambda e, n, i, g: [e.op("max_pool2d_grad", n.inputs[0], g, **dict(n.attrs))], ("kernel", "pool"))
row("max_pool2d_grad", _pool_grad_shape, _maxpool_grad_ref, None, ("kernel", "pool"))
row("avg_pool2d", _pool_shape, _avgpool_ref,
    lambda e, n, i, g: [e.op("avg_pool2d_grad", n.inputs[0], g, **dict(n.attrs))], ("kernel", "pool"))
row("avg_pool2d_grad", _pool_grad_shape, _avgpool_grad_ref, None, ("kernel", "pool"))
NOT_DIFFERENTIABLE.update({"max_pool2d_grad", "avg_pool2d_grad"})

# ------------------------------------------------------- slicing, padding, where


def _slice_shape(nodes, at):
    x = nodes[0].shape
    starts, steps, shape = at["starts"], at["steps"], tuple(at["shape"])
    assert len(starts) == len(steps) == len(shape) == len(x), "slice needs a start, step and size per axis"
    for d, s0, st, n in zip(x, starts, steps, shape):
        assert st != 0 and n >= 0, "slice steps are non-zero"
        assert n == 0 or (0 <= s0 < d and 0 <= s0 + (n - 1) * st < d), f"slice out of range on an axis of {d}"
    return nodes[0].dtype, shape


def _slice_index(starts, steps, shape):
    return np.ix_(*[np.arange(n) * st + s0 for s0, st, n in zip(starts, steps, shape)])


def _slice_ref(xs, at):
    return xs[0][_slice_index(at["starts"], at["steps"], at["shape"])]


def _pad_shape(nodes, at):
    x = nodes[0].shape
    starts, steps, shape = at["starts"], at["steps"], tuple(at["shape"])
    assert len(starts) == len(steps) == len(shape) == len(x), "pad needs a start, step and size per axis"
    for d, s0, st, n in zip(x, starts, steps, shape):
        assert st != 0 and (d == 0 or 0 <= s0 + (d - 1) * st < n and 0 <= s0 < n), "pad places x outside the output"
    return nodes[0].dtype, shape


def _pad_ref(xs, at):
    x = xs[0]
    out = np.full(at["shape"], at.get("value", 0.0), dtype=x.dtype)
    out[_slice_index(at["starts"], at["steps"], x.shape)] = x
    return out


def _g_slice(e, n, i, g):
    x = n.inputs[0]
    return [e.op("pad", g, starts=n.attr("starts"), steps=n.attr("steps"), shape=e.shape(x), value=0.0)]


def _g_pad(e, n, i, g):
    x = n.inputs[0]
    return [e.op("slice", g, starts=n.attr("starts"), steps=n.attr("steps"), shape=e.shape(x))]


# slice reads x[start + c * step]; pad writes x at start + c * step into a filled tensor
row("slice", _slice_shape, _slice_ref, _g_slice, (EW, "{0}"))
row("pad", _pad_shape, _pad_ref, _g_pad, (EW, "{0}"))


def _where_shape(nodes, at):
    assert nodes[1].dtype == nodes[2].dtype, f"where picks between {nodes[1].dtype} and {nodes[2].dtype}"
    shape = np.broadcast_shapes(*(n.shape for n in nodes))
    return nodes[1].dtype, shape


def _g_where(e, n, i, g):
    c, a, b = n.inputs
    ga = e.op("where", c, g, e.const(0.0))
    gb = e.op("where", c, e.const(0.0), g)
    return [None, e.sum_to(ga, e.shape(a)), e.sum_to(gb, e.shape(b))]


row("where", _where_shape, lambda xs, at: np.where(xs[0] != 0, xs[1], xs[2]), _g_where,
    (EW, "select({2}, {1}, {0} != 0.0)"))


def _concat_shape(nodes, at):
    axis = at["axis"] % len(nodes[0].shape)
    base = list(nodes[0].shape)
    for n in nodes[1:]:
        assert len(n.shape) == len(base) and all(a == b for k, (a, b) in enumerate(zip(n.shape, base)) if k != axis), \
            "concat inputs differ off the concat axis"
    base[axis] = sum(n.shape[axis] for n in nodes)
    return nodes[0].dtype, tuple(base)


def _d_concat(e, n):
    axis = n.attr("axis") % len(n.shape)
    out, offset = None, 0
    for x in n.inputs:
        xs = e.shape(x)
        starts = tuple(offset if a == axis else 0 for a in range(len(xs)))
        placed = e.op("pad", x, starts=starts, steps=(1,) * len(xs), shape=n.shape, value=0.0)
        out = placed if out is None else e.op("add", out, placed)
        offset += xs[axis]
    return out


row("concat", _concat_shape, lambda xs, at: np.concatenate(xs, axis=at["axis"]), _via, ("decompose", _d_concat))

# -------------------------------------------------------------------- embedding


def _gather_shape(nodes, at):
    table, idx = nodes
    assert idx.dtype == "i32", "gather indices are integers"
    return table.dtype, idx.shape + table.shape[1:]


def _gather_ref(xs, at):
    table, idx = xs
    idx = np.where(idx < 0, idx + table.shape[0], idx)
    return table[idx.astype(np.int64)]


def _scatter_shape(nodes, at):
    g, idx = nodes
    return "f32", (int(at["rows"]),) + g.shape[len(idx.shape):]


def _scatter_ref(xs, at):
    g, idx = xs
    rows = int(at["rows"])
    inner = g.shape[idx.ndim:]
    out = np.zeros((rows,) + inner, dtype=g.dtype)
    idx = np.where(idx < 0, idx + rows, idx).reshape(-1).astype(np.int64)
    inside = (idx >= 0) & (idx < rows)  # rows gather read as 0 get no gradient
    np.add.at(out, idx[inside], g.reshape((-1,) + inner)[inside])
    return out


row("gather", _gather_shape, _gather_ref,
    lambda e, n, i, g: [e.op("scatter_add", g, n.inputs[1], rows=e.shape(n.inputs[0])[0]), None],
    ("kernel", "gather"))
row("scatter_add", _scatter_shape, _scatter_ref, None, ("kernel", "gather"))
NOT_DIFFERENTIABLE.add("scatter_add")

# ------------------------------------------------------------ more activations
row("silu", same_shape, lambda xs, at: xs[0] / (1 + np.exp(-xs[0])),
    lambda e, n, i, g: [e.op("mul", g, e.op("silu_grad", n.inputs[0]))], (EW, "({0} * mn_sigmoid({0}))"))
row("silu_grad", same_shape, lambda xs, at: (lambda s: s * (1 + xs[0] * (1 - s)))(1 / (1 + np.exp(-xs[0]))), None,
    (EW, "mn_silu_grad({0})"))
row("softplus", same_shape, lambda xs, at: np.where(xs[0] > 20, xs[0], np.log1p(np.exp(np.minimum(xs[0], 20)))),
    lambda e, n, i, g: [e.op("mul", g, e.op("sigmoid", n.inputs[0]))], (EW, "mn_softplus({0})"))
NOT_DIFFERENTIABLE.add("silu_grad")


def _d_swiglu(e, n):
    a, b = n.inputs
    return e.op("mul", e.op("silu", a), b)


row("swiglu", broadcast_shape, lambda xs, at: xs[0] / (1 + np.exp(-xs[0])) * xs[1], _via, ("decompose", _d_swiglu))

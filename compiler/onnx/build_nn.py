"""Graph builders for convolutions, pooling, normalisation and resizing. 1-D ops run
as their 2-D row with a height of 1; 3-D ones as 2-D rows over depth slices: a 3-D
convolution is one 2-D convolution of the kernel's depth slices stacked as channels,
a 3-D max pool the maximum of 2-D pools of depth slices, an average pool (also a dilated
2-D one) a window sum by convolution with ones divided by each window's count."""
from __future__ import annotations

import numpy as np

from ..ir.ops_nn import conv_out
from .build_sample import resize_weights
from .common import Known, as_ints


def _spatial(im, x, op):
    nd = len(x.shape) - 2
    if nd not in (1, 2, 3):
        raise NotImplementedError(f"node {im.label!r}: {op} over {nd} spatial dimensions (only 1-D to 3-D)")
    return nd


def _to2d(im, t, nd):
    return t if nd == 2 else im.b.reshape(t, t.shape[:2] + (1,) + t.shape[2:])


def _pads(at, sizes, kernel, strides, dil, nd, op):
    """(begin..., end...) with auto_pad resolved (SAME_*: the output is ceil(in / stride))."""
    auto = at.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for n, k, s, d in zip(sizes, kernel, strides, dil):
            total = max(0, (-(-n // s) - 1) * s + (k - 1) * d + 1 - n)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            begin.append(lo)
            end.append(total - lo)
        return begin + end
    if auto == "VALID":
        return [0] * (2 * nd)
    if auto != "NOTSET":
        raise NotImplementedError(f"{op} auto_pad {auto!r}")
    return as_ints(at.get("pads", [0] * (2 * nd)))


def _geometry(at, x, kernel, nd, op):
    """strides, dilations, padding (top, left, bottom, right) as the 2-D rows take them."""
    strides = as_ints(at.get("strides", [1] * nd))
    dil = as_ints(at.get("dilations", [1] * nd))
    p = _pads(at, x.shape[2:], kernel, strides, dil, nd, op)
    if nd == 1:
        return (1, strides[0]), (1, dil[0]), (0, p[0], 0, p[1])
    return tuple(strides), tuple(dil), (p[0], p[1], p[2], p[3])


def _from2d(im, y, nd):
    return y if nd == 2 else im.b.reshape(y, y.shape[:2] + y.shape[3:])


def _bias(im, y, ins, i):
    if len(ins) > i and ins[i]:
        c = im.tensor(ins[i])
        y = y + im.b.reshape(c, (c.shape[0],) + (1,) * (len(y.shape) - 2))
    return y


def _b_conv(im, ins, at):
    x, w = im.tensor(ins[0]), im.tensor(ins[1])
    nd = _spatial(im, x, "Conv")
    if nd == 3:
        return _bias(im, _conv3d(im, x, w, at), ins, 2)
    s, d, p = _geometry(at, x, w.shape[2:], nd, "Conv")
    y = im.b.conv2d(_to2d(im, x, nd), _to2d(im, w, nd), stride=s, padding=p, dilation=d,
                    groups=int(at.get("group", 1)))
    return _from2d(im, _bias(im, y, ins, 2), nd)


def _depth_first(b, t):
    """[N, C, D, ...] <-> [N, D, C, ...]."""
    return b.transpose(t, (0, 2, 1) + tuple(range(3, len(t.shape))))


def _conv3d(im, x, w, at):
    """One conv2d over [N * Do, kD * C, H, W]: the input's depth slices that each kernel
    depth tap reads, stacked as channels (grouped as the weight's [O, kD * C/g, kh, kw])."""
    b = im.b
    n, c, depth = x.shape[:3]
    o, cg, kd = w.shape[:3]
    groups = int(at.get("group", 1))
    strides = as_ints(at.get("strides", [1] * 3))
    dil = as_ints(at.get("dilations", [1] * 3))
    p = _pads(at, x.shape[2:], w.shape[2:], strides, dil, 3, "Conv")
    do = conv_out(depth, kd, strides[0], p[0], p[3], dil[0])
    xp = _pad_depth(b, x, p[0], max(depth + p[0] + p[3], (do - 1) * strides[0] + (kd - 1) * dil[0] + 1), 0.0)
    taps = []
    for t in range(kd):
        sl = _depth_slice(b, xp, t * dil[0], strides[0], do)
        taps.append(b.reshape(_depth_first(b, sl), (n * do, groups, 1, cg) + x.shape[3:]))
    stacked = b.reshape(taps[0] if kd == 1 else b.concat(*taps, axis=2), (n * do, kd * c) + x.shape[3:])
    w2 = b.reshape(b.transpose(w, (0, 2, 1, 3, 4)), (o, kd * cg) + w.shape[3:])
    y = b.conv2d(stacked, w2, stride=tuple(strides[1:]), padding=(p[1], p[2], p[4], p[5]), dilation=tuple(dil[1:]),
                 groups=groups)
    return _depth_first(b, b.reshape(y, (n, do) + y.shape[1:]))


def _pad_depth(b, x, begin, length, value):
    """x with its depth (axis 2) placed at `begin` in `length` slots filled with `value`."""
    if begin == 0 and length == x.shape[2]:
        return x
    shape = x.shape[:2] + (length,) + x.shape[3:]
    return b.pad(x, starts=(0, 0, begin) + (0,) * (len(x.shape) - 3), steps=(1,) * len(x.shape), shape=shape,
                 value=value)


def _depth_slice(b, x, start, step, count):
    if start == 0 and step == 1 and count == x.shape[2]:
        return x
    rank = len(x.shape)
    return b.slice(x, starts=(0, 0, start) + (0,) * (rank - 3), steps=(1, 1, step if count > 1 else 1) + (1,) * (rank - 3),
                   shape=x.shape[:2] + (count,) + x.shape[3:])


def _convT_geometry(at, sizes, kernel, nd):
    """strides, dilations, output padding, pads (begin..., end...) of a ConvTranspose."""
    strides = as_ints(at.get("strides", [1] * nd))
    dil = as_ints(at.get("dilations", [1] * nd))
    outpad = as_ints(at.get("output_padding", [0] * nd))
    auto = at.get("auto_pad", "NOTSET")
    if "output_shape" in at or auto in ("SAME_UPPER", "SAME_LOWER"):
        want = as_ints(at["output_shape"])[-nd:] if "output_shape" in at else [n * s for n, s in zip(sizes, strides)]
        begin, end = [], []
        for i in range(nd):
            total = strides[i] * (sizes[i] - 1) + outpad[i] + (kernel[i] - 1) * dil[i] + 1 - want[i]
            if total < 0:  # a larger output than the kernel covers: zeros at the end
                outpad[i] -= total
                total = 0
            hi = total // 2 if auto != "SAME_UPPER" else total - total // 2
            begin.append(total - hi)
            end.append(hi)
        return strides, dil, outpad, begin + end
    if auto in ("VALID", "NOTSET"):
        return strides, dil, outpad, as_ints(at.get("pads", [0] * (2 * nd))) if auto == "NOTSET" else [0] * (2 * nd)
    raise NotImplementedError(f"ConvTranspose auto_pad {auto!r}")


def _b_conv_transpose(im, ins, at):
    x, w = im.tensor(ins[0]), im.tensor(ins[1])
    nd = _spatial(im, x, "ConvTranspose")
    strides, dil, outpad, pads = _convT_geometry(at, x.shape[2:], w.shape[2:], nd)
    if nd == 3:
        return _bias(im, _conv_transpose3d(im, x, w, int(at.get("group", 1)), strides, dil, outpad, pads), ins, 2)
    if nd == 1:
        s, d, p, op = (1, strides[0]), (1, dil[0]), (0, pads[0], 0, pads[1]), (0, outpad[0])
    else:
        s, d, p, op = tuple(strides), tuple(dil), tuple(pads), tuple(outpad)
    y = im.b.conv_transpose2d(_to2d(im, x, nd), _to2d(im, w, nd), stride=s, padding=p, dilation=d,
                              groups=int(at.get("group", 1)), output_padding=op)
    return _from2d(im, _bias(im, y, ins, 2), nd)


def _conv_transpose3d(im, x, w, groups, strides, dil, outpad, pads):
    """One conv_transpose2d per input depth slice with every kernel depth tap as more output
    channels; each tap's outputs are then placed at depth i * stride + tap * dilation."""
    b = im.b
    n, c, depth = x.shape[:3]
    _, og, kd = w.shape[:3]
    xr = b.reshape(_depth_first(b, x), (n * depth, c) + x.shape[3:])
    w2 = b.reshape(b.transpose(w, (0, 2, 1, 3, 4)), (c, kd * og) + w.shape[3:])
    y = b.conv_transpose2d(xr, w2, stride=tuple(strides[1:]), padding=(pads[1], pads[2], pads[4], pads[5]),
                           dilation=tuple(dil[1:]), groups=groups, output_padding=tuple(outpad[1:]))
    ho, wo = y.shape[2:]
    y = b.transpose(b.reshape(y, (n, depth, groups, kd, og, ho, wo)), (3, 0, 2, 4, 1, 5, 6))  # [kD, N, g, og, D, ...]
    length = (depth - 1) * strides[0] + (kd - 1) * dil[0] + 1 + outpad[0]
    total = None
    for t in range(kd):
        yt = b.reshape(b.slice(y, starts=(t,) + (0,) * 6, steps=(1,) * 7, shape=(1,) + y.shape[1:]),
                       (n, groups * og, depth, ho, wo))
        placed = b.pad(yt, starts=(0, 0, t * dil[0], 0, 0), steps=(1, 1, strides[0], 1, 1),
                       shape=(n, groups * og, length, ho, wo), value=0.0)
        total = placed if total is None else total + placed
    return _depth_slice(b, total, pads[0], 1, length - pads[0] - pads[3])


def pool_builder(kind):
    def build(im, ins, at):
        x = im.tensor(ins[0])
        op = "MaxPool" if kind == "max" else "AveragePool"
        nd = _spatial(im, x, op)
        indices = len(im.node.output) > 1 and bool(im.node.output[1])
        kernel = as_ints(at["kernel_shape"])
        ceil = bool(at.get("ceil_mode", 0))
        if indices or x.dtype == "i32":
            if nd == 3:
                raise NotImplementedError(f"node {im.label!r}: a 3-D MaxPool of integers or with Indices")
            s, d, p = _geometry(at, x, kernel, nd, op)
            y, idx = _max_pool_by_taps(im, _to2d(im, x, nd), tuple(kernel) if nd == 2 else (1, kernel[0]), s, d, p,
                                       ceil, int(at.get("storage_order", 0)), indices)
            return [_from2d(im, y, nd)] + ([_from2d(im, idx, nd)] if indices else [])
        if kind == "avg" and (nd == 3 or any(d != 1 for d in as_ints(at.get("dilations", [1] * nd)))):
            return _avg_pool_by_sums(im, x, at, kernel, nd, ceil)
        if nd == 3:
            return _max_pool3d(im, x, at, kernel, ceil)
        s, d, p = _geometry(at, x, kernel, nd, op)
        k = tuple(kernel) if nd == 2 else (1, kernel[0])
        if kind == "max":
            y = im.b.max_pool2d(_to2d(im, x, nd), kernel=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)
        else:
            include = bool(at.get("count_include_pad", 0))
            y = im.b.avg_pool2d(_to2d(im, x, nd), kernel=k, stride=s, padding=p, ceil_mode=ceil,
                                count_include_pad=include)
        return _from2d(im, y, nd)
    return build


def _max_pool_by_taps(im, x, kernel, s, d, p, ceil, storage_order, indices):
    """(y, indices or None) of a 2-D max pool: the maximum over the window taps (strided
    slices of x padded with its lowest value; exact for integers), and where indices are
    wanted the flat input position of each window's first maximum (ONNX's row-major
    order; storage_order 1: column-major within each image)."""
    b = im.b
    n, c, h, w = x.shape
    ho, wo = (conv_out(h, kernel[0], s[0], p[0], p[2], d[0], ceil), conv_out(w, kernel[1], s[1], p[1], p[3], d[1], ceil))
    size = [max(h + p[0] + p[2], (ho - 1) * s[0] + (kernel[0] - 1) * d[0] + 1),
            max(w + p[1] + p[3], (wo - 1) * s[1] + (kernel[1] - 1) * d[1] + 1)]
    xp = b.pad(x, starts=(0, 0, p[0], p[1]), steps=(1,) * 4, shape=(n, c, *size),
               value=-(1 << 31) if x.dtype == "i32" else float("-inf"))
    taps = [(i, j, b.slice(xp, starts=(0, 0, i * d[0], j * d[1]), steps=(1, 1, s[0] if ho > 1 else 1,
                                                                          s[1] if wo > 1 else 1),
                           shape=(n, c, ho, wo))) for i in range(kernel[0]) for j in range(kernel[1])]
    if x.dtype == "f32":
        y = b.max_pool2d(x, kernel=kernel, stride=s, padding=p, dilation=d, ceil_mode=ceil)
    else:
        y = taps[0][2]
        for _, _, t in taps[1:]:
            y = b.op("maximum", y, t)
    if not indices:
        return y, None
    plane = np.arange(n * c).reshape(n, c, 1, 1) * (h * w)
    idx = b.constant_ids(np.full((n, c, ho, wo), -1, np.int64))
    for i, j, t in reversed(taps):  # the first tap that holds the maximum wins
        rows, cols = np.arange(ho) * s[0] + i * d[0] - p[0], np.arange(wo) * s[1] + j * d[1] - p[1]
        inside = ((rows >= 0) & (rows < h))[:, None] & ((cols >= 0) & (cols < w))[None, :]
        flat = rows[:, None] * w + cols[None, :] if storage_order == 0 else rows[:, None] + cols[None, :] * h
        hit = b.op("eq", t, y) * b.constant(inside.astype(np.float64))
        idx = b.op("where", hit, b.constant_ids(plane + flat), idx)
    return y, idx


def _pool_geometry(at, x, kernel, nd, ceil, op):
    """strides, dilations, pads (begin..., end...), output sizes of a pool."""
    strides = as_ints(at.get("strides", [1] * nd))
    dil = as_ints(at.get("dilations", [1] * nd))
    p = _pads(at, x.shape[2:], kernel, strides, dil, nd, op)
    outs = [conv_out(x.shape[2 + i], kernel[i], strides[i], p[i], p[nd + i], dil[i], ceil) for i in range(nd)]
    return strides, dil, p, outs


def _max_pool3d(im, x, at, kernel, ceil):
    """The maximum over the kernel's depth taps of 2-D max pools of depth slices (padded with -inf)."""
    b = im.b
    strides, dil, p, (do, ho, wo) = _pool_geometry(at, x, kernel, 3, ceil, "MaxPool")
    n, c, depth = x.shape[:3]
    length = max(depth + p[0] + p[3], (do - 1) * strides[0] + (kernel[0] - 1) * dil[0] + 1)
    xp = _pad_depth(b, x, p[0], length, float("-inf"))
    y = None
    for t in range(kernel[0]):
        sl = b.reshape(_depth_slice(b, xp, t * dil[0], strides[0], do), (n, c * do) + x.shape[3:])
        m = b.max_pool2d(sl, kernel=tuple(kernel[1:]), stride=tuple(strides[1:]), padding=(p[1], p[2], p[4], p[5]),
                         dilation=tuple(dil[1:]), ceil_mode=ceil)
        y = m if y is None else b.op("maximum", y, m)
    return b.reshape(y, (n, c, do, ho, wo))


def _avg_pool_by_sums(im, x, at, kernel, nd, ceil):
    """Window sums (a convolution with ones per depth tap) divided by each window's count:
    the taps inside the input, or with count_include_pad inside the padded input."""
    b = im.b
    strides, dil, p, outs = _pool_geometry(at, x, kernel, nd, ceil, "AveragePool")
    lift = 3 - nd  # as 3-D with unit leading spatial axes
    k3, s3, d3 = [1] * lift + kernel, [1] * lift + strides, [1] * lift + dil
    lo, hi, o3 = [0] * lift + p[:nd], [0] * lift + p[nd:], [1] * lift + outs
    n, c = x.shape[:2]
    x5 = b.reshape(x, (n, c) + (1,) * lift + x.shape[2:])
    size = x5.shape[2:]
    ones = b.constant(np.ones((1, 1, k3[1], k3[2])))
    # conv2d's output has floor sizes: ceil mode's last window gets more zero padding
    extra = [max(0, (o3[i] - 1) * s3[i] + (k3[i] - 1) * d3[i] + 1 - (size[i] + lo[i] + hi[i])) for i in range(3)]
    xp = _pad_depth(b, x5, lo[0], size[0] + lo[0] + hi[0] + extra[0], 0.0)
    total = None
    for t in range(k3[0]):
        sl = b.reshape(_depth_slice(b, xp, t * d3[0], s3[0], o3[0]), (n * c * o3[0], 1) + size[1:])
        y = b.conv2d(sl, ones, stride=tuple(s3[1:]), padding=(lo[1], lo[2], hi[1] + extra[1], hi[2] + extra[2]),
                     dilation=tuple(d3[1:]))
        total = y if total is None else total + y
    include = bool(at.get("count_include_pad", 0))
    counts = [_window_counts(size[i], k3[i], s3[i], d3[i], lo[i], hi[i], o3[i], include) for i in range(3)]
    div = counts[0][:, None, None] * counts[1][None, :, None] * counts[2][None, None, :]
    y = b.reshape(total, (n, c) + tuple(o3)) * b.constant(1.0 / div)
    return b.reshape(y, (n, c) + tuple(outs))


def _window_counts(size, k, s, d, lo, hi, outs, include):
    """Taps of each window along one axis that fall inside the input (or the padded input)."""
    taps = np.arange(outs)[:, None] * s + np.arange(k)[None, :] * d - lo  # input positions
    first, end = (-lo, size + hi) if include else (0, size)
    return ((taps >= first) & (taps < end)).sum(axis=1).astype(np.float64)


def _b_global_pool(kind):
    def build(im, ins, at):
        x = im.tensor(ins[0])
        axes = list(range(2, len(x.shape)))
        return im.b.mean(x, axes, True) if kind == "mean" else im.b.max(x, axes, True)
    return build


# ---------------------------------------------------------------- normalisation
def _freeze(im, name):
    """A running statistic is never trained, also when the exporter said nothing."""
    v = im.env[name]
    if isinstance(v, Known) and v.kind == "param" and v.tensor is None:
        v.kind = "buffer"
    return im.tensor(name)


def _b_batch_norm(im, ins, at):
    if at.get("training_mode", 0) or any(im.node.output[1:]):
        raise NotImplementedError(f"node {im.label!r}: BatchNormalization in training mode")
    x, scale, bias = (im.tensor(n) for n in ins[:3])
    mean, var = _freeze(im, ins[3]), _freeze(im, ins[4])
    return im.b.batch_norm(x, scale, bias, mean, var, eps=float(at.get("epsilon", 1e-5)), training=False)


def _b_layer_norm(im, ins, at):
    b, x = im.b, im.tensor(ins[0])
    rank = len(x.shape)
    axis = int(at.get("axis", -1)) % rank
    eps = float(at.get("epsilon", 1e-5))
    w = im.tensor(ins[1])
    bias = im.tensor(ins[2]) if len(ins) > 2 and ins[2] else None
    if not any(im.node.output[1:]):
        return b.layer_norm(x, w, *([bias] if bias is not None else []), eps=eps, normalized_ndim=rank - axis)
    axes = list(range(axis, rank))
    mean = b.mean(x, axes, True)
    d = x - mean
    inv = b.pow(b.mean(d * d, axes, True) + eps, -0.5)
    y = d * inv * w
    return [y + bias if bias is not None else y, mean, inv]


def _per_channel(im, name, channels, groups):
    """GroupNormalization before opset 21 scales per group: repeat each to its channels."""
    t = im.tensor(name)
    if im.opset >= 21 or t.shape == (channels,) and groups == channels:
        return t
    if t.shape != (groups,):
        raise ValueError(f"node {im.label!r}: scale/bias of shape {t.shape} for {groups} groups")
    per = channels // groups
    return im.b.reshape(im.b.op("broadcast_to", im.b.reshape(t, (groups, 1)), shape=(groups, per)), (channels,))


def _b_group_norm(im, ins, at):
    x = im.tensor(ins[0])
    c, g = x.shape[1], int(at["num_groups"])
    w, bias = (_per_channel(im, n, c, g) for n in ins[1:3])
    return im.b.group_norm(x, w, bias, groups=g, eps=float(at.get("epsilon", 1e-5)))


def _b_instance_norm(im, ins, at):
    x = im.tensor(ins[0])
    return im.b.group_norm(x, im.tensor(ins[1]), im.tensor(ins[2]), groups=x.shape[1],
                           eps=float(at.get("epsilon", 1e-5)))


def _b_rms_norm(im, ins, at):
    x = im.tensor(ins[0])
    rank = len(x.shape)
    axis = int(at.get("axis", -1)) % rank
    return im.b.rms_norm(x, im.tensor(ins[1]), eps=float(at.get("epsilon", 1e-5)), normalized_ndim=rank - axis)


def _b_lp_norm(im, ins, at):
    b, x = im.b, im.tensor(ins[0])
    axis, p = int(at.get("axis", -1)) % len(x.shape), int(at.get("p", 2))
    if p == 2:
        norm = b.sqrt(b.sum(x * x, [axis], True))
    elif p == 1:
        norm = b.sum(b.op("maximum", x, -x), [axis], True)
    else:
        raise NotImplementedError(f"node {im.label!r}: LpNormalization with p={p}")
    return b.op("where", b.op("eq", norm, 0.0), 0.0, x / norm)  # 0 / 0 is 0


def _b_mvn(im, ins, at):
    b, x = im.b, im.tensor(ins[0])
    axes = [a % len(x.shape) for a in as_ints(at.get("axes", [0, 2, 3]))]
    d = x - b.mean(x, axes, True)
    return d / (b.sqrt(b.mean(d * d, axes, True)) + 1e-9)


# ----------------------------------------------------------------------- resize
_TRANSFORMS = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel")


def _b_resize(im, ins, at):
    x = im.tensor(ins[0])
    rank = len(x.shape)
    mode = at.get("mode", "nearest")
    if im.node.op_type == "Upsample" or im.opset < 11:  # Upsample-9 / Resize-10: scales only
        transform, nearest = "asymmetric", "floor"
        scales = at.get("scales", im.opt(ins, 1, "scales"))
        sizes = None
    else:
        transform = at.get("coordinate_transformation_mode", "half_pixel")
        nearest = at.get("nearest_mode", "round_prefer_floor")
        scales, sizes = im.opt(ins, 2, "scales"), im.opt(ins, 3, "sizes")
        if scales is not None and np.asarray(scales).size == 0:
            scales = None
        if sizes is not None and np.asarray(sizes).size == 0:
            sizes = None
    mode = {"bilinear": "linear"}.get(mode, mode)
    axes = [a % rank for a in as_ints(at.get("axes", range(rank)))]
    full_scale, full_size = [1.0] * rank, list(x.shape)
    if sizes is not None:
        sizes = as_ints(sizes)
        policy = at.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            ratios = [sizes[i] / x.shape[a] for i, a in enumerate(axes)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            scales = [r] * len(axes)
            sizes = [int(r * x.shape[a] + 0.5) for a in axes]
        for i, a in enumerate(axes):
            full_size[a] = sizes[i]
            full_scale[a] = sizes[i] / x.shape[a]
        if policy == "stretch":
            scales = None
    if scales is not None:
        sc = [float(s) for s in np.asarray(scales).reshape(-1)]
        for i, a in enumerate(axes):
            full_scale[a] = sc[i]
            if sizes is None:
                full_size[a] = int(np.floor(x.shape[a] * sc[i] + 1e-9))
    if transform not in _TRANSFORMS or at.get("antialias", 0) or at.get("exclude_outside", 0):
        roi = im.opt(ins, 1, "roi") if transform == "tf_crop_and_resize" else None
        return _resize_by_axes(im, x, axes, full_scale, full_size, roi, at, mode, transform, nearest)
    moved = [a for a in range(rank) if full_size[a] != x.shape[a] or full_scale[a] != 1.0]
    if not moved:
        return x
    if moved[0] < rank - 2:
        raise NotImplementedError(f"node {im.label!r}: Resize of axes {moved} (only the last two)")
    if transform == "align_corners" and scales is not None:
        # ONNX maps with the unrounded output length in * scale: the asymmetric map
        # o / s' with s' = (in * scale - 1) / (in - 1) is the same line
        for a in (rank - 2, rank - 1):
            n, s = x.shape[a] if a >= 0 else 1, full_scale[a] if a >= 0 else 1.0
            full_scale[a] = (n * s - 1) / (n - 1) if n > 1 and n * s != 1 else 1.0
        transform = "asymmetric"
    y = x if rank >= 2 else im.b.reshape(x, (1,) + x.shape)
    size = (full_size[-2] if rank >= 2 else 1, full_size[-1])
    given = None if scales is None else ((full_scale[-2] if rank >= 2 else 1.0), full_scale[-1])
    y = im.b.resize(y, size=size, scales=given, mode=mode, transform=transform,
                    cubic_a=float(at.get("cubic_coeff_a", -0.75)), nearest_mode=nearest)
    return y if rank >= 2 else im.b.reshape(y, y.shape[1:])


def _resize_by_axes(im, x, axes, scale, size, roi, at, mode, transform, nearest):
    """Resize one axis at a time, each a matmul with the weights resize_weights gives (any
    axes; antialias, exclude_outside, tf_crop_and_resize, half_pixel_symmetric)."""
    b, rank = im.b, len(x.shape)
    if mode == "nearest" and at.get("antialias", 0):
        raise ValueError(f"node {im.label!r}: Resize antialias with mode 'nearest'")
    for i, a in enumerate(axes):
        r = (0.0, 1.0) if roi is None else tuple(float(v) for v in np.asarray(roi).reshape(-1)[[i, len(axes) + i]])
        if size[a] == x.shape[a] and scale[a] == 1.0 and r == (0.0, 1.0):
            continue
        m, outside = resize_weights(x.shape[a], size[a], scale[a], mode, transform, r, float(at.get("cubic_coeff_a", -0.75)),
                                    nearest, bool(at.get("antialias", 0)), bool(at.get("exclude_outside", 0)))
        perm = [d for d in range(rank) if d != a] + [a]
        y = b.matmul(b.transpose(x, perm) if a != rank - 1 else x, b.constant(m), trans_b=True)
        if outside is not None:  # tf_crop_and_resize: outputs whose source lies outside the input
            y = y + b.constant(float(at.get("extrapolation_value", 0.0)) * outside)
        x = b.transpose(y, list(np.argsort(perm))) if a != rank - 1 else y
    return x


BUILD_NN = {
    "Conv": _b_conv,
    "ConvTranspose": _b_conv_transpose,
    "MaxPool": pool_builder("max"),
    "AveragePool": pool_builder("avg"),
    "GlobalAveragePool": _b_global_pool("mean"),
    "GlobalMaxPool": _b_global_pool("max"),
    "BatchNormalization": _b_batch_norm,
    "LayerNormalization": _b_layer_norm,
    "GroupNormalization": _b_group_norm,
    "InstanceNormalization": _b_instance_norm,
    "RMSNormalization": _b_rms_norm,
    "LpNormalization": _b_lp_norm,
    "MeanVarianceNormalization": _b_mvn,
    "Resize": _b_resize,
    "Upsample": _b_resize,
}

"""Graph builders for sampling at computed positions: GridSample, AffineGrid, Col2Im,
DeformConv (GridSample's bilinear taps at offset kernel positions, then a matmul), RoiAlign
(regions known at import: constant sample pixels and weights), and the per-axis weights of
the Resize modes the IR's resize row lacks.

GridSample reads the input as a table of rows (one per batch item and pixel, channels
last) with `gather`, at ids computed from the grid in float arithmetic (exact below
2^24 rows); floor and truncation are casts to i32 and back, so gradients flow to the grid
through the interpolation weights only, as in PyTorch. Positions follow the ONNX
reference: coordinates outside the borders are clamped (border) or reflected
(reflection) before interpolating, and each tap's index again by the padding mode.
"""
from __future__ import annotations

import itertools

import numpy as np

from .build_index import EXACT_IDS
from .common import as_ints

CUBIC_A = -0.75


def _trunc(b, x):
    return b.op("cast", b.op("cast", x, to="i32"), to="f32")


def _floor(b, x):
    t = _trunc(b, x)
    return t - b.op("step", t - x)


def _rint(b, x):
    """Round half to even, as numpy.rint."""
    r = _floor(b, x + 0.5)
    tie = b.op("eq", r - x, 0.5)
    odd = r - 2.0 * _floor(b, r * 0.5)
    return r - tie * odd


def _clamp(b, x, lo, hi):
    return -b.op("maximum", -b.op("maximum", x, lo), -hi)


def _reflect(b, x, lo, hi):
    """x folded into [lo, hi] by reflecting at the borders (the ONNX reference's _gs_reflect)."""
    span = hi - lo
    below, above = b.op("step", lo - x), b.op("step", x - hi)
    dx = b.op("where", below, lo - x, x - hi)
    n = _floor(b, dx * (1.0 / span))
    r = dx - n * span
    odd = n - 2.0 * _floor(b, n * 0.5)
    from_lo = b.op("where", odd, hi - r, r + lo)
    from_hi = b.op("where", odd, r + lo, hi - r)
    return b.op("where", below, from_lo, b.op("where", above, from_hi, x))


def _cubic(b, t):
    """The four cubic convolution weights of taps -1, 0, 1, 2 at fraction t."""
    a = CUBIC_A

    def near(s):  # |s| <= 1
        return ((a + 2) * s - (a + 3)) * s * s + 1.0

    def far(s):  # 1 < |s| < 2
        return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a
    return [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]


def _axis_taps(b, x, size, mode, pad, lo, hi):
    """[(index, weight or None, valid mask or None)] of one axis at coordinates x."""
    if mode == "nearest":
        taps = [(_trunc(b, x), None)]
    else:
        x0 = _floor(b, x)
        t = x - x0
        if mode == "linear":
            taps = [(x0, 1.0 - t), (x0 + 1.0, t)]
        else:
            taps = [(x0 + float(k - 1), w) for k, w in enumerate(_cubic(b, t))]
    out = []
    for i, w in taps:
        if pad == "zeros":
            out.append((i, w, b.op("step", i + 0.5) * b.op("step", (size - 0.5) - i)))
        elif pad == "border":
            out.append((_clamp(b, i, 0.0, float(size - 1)), w, None))
        else:
            out.append((_trunc(b, _reflect(b, i, lo, hi)), w, None))
    return out


def _b_grid_sample(im, ins, at):
    b, x, grid = im.b, im.tensor(ins[0]), im.tensor(ins[1])
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(at.get("mode", "linear" if im.opset >= 20 else "bilinear"),
                                                         at.get("mode", "linear"))
    pad, align = at.get("padding_mode", "zeros"), bool(at.get("align_corners", 0))
    if mode not in ("nearest", "linear", "cubic") or pad not in ("zeros", "border", "reflection"):
        raise NotImplementedError(f"node {im.label!r}: GridSample mode {mode!r}, padding {pad!r}")
    n, c, sizes = x.shape[0], x.shape[1], x.shape[2:]
    nd, out = len(sizes), grid.shape[1:-1]
    rows = n * int(np.prod(sizes))
    if rows + 1 >= EXACT_IDS:
        raise NotImplementedError(f"node {im.label!r}: GridSample of {rows} pixels (at most 2^24)")
    table = b.reshape(b.transpose(x, (0,) + tuple(range(2, nd + 2)) + (1,)), (rows, c))
    if pad == "zeros":  # a row of zeros past the pixels, read by the taps outside them
        table = b.pad(table, starts=(0, 0), steps=(1, 1), shape=(rows + 1, c), value=0.0)
    per_axis = []
    for a, size in enumerate(sizes):
        g = b.reshape(b.slice(grid, starts=(0,) * (nd + 1) + (nd - 1 - a,), steps=(1,) * (nd + 2),
                              shape=grid.shape[:-1] + (1,)), grid.shape[:-1])
        xa = (g + 1.0) * (0.5 * (size - 1)) if align else ((g + 1.0) * size - 1.0) * 0.5
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if mode == "nearest":
            xa = _rint(b, xa)
        if pad == "border":
            outside = b.op("step", lo - xa) + b.op("step", xa - hi)
            xa = b.op("where", outside, _clamp(b, xa, 0.0, float(size - 1)), xa)
        elif pad == "reflection":
            xa = _reflect(b, xa, lo, hi)
        per_axis.append(_axis_taps(b, xa, size, mode, pad, lo, hi))
    base = b.constant((np.arange(n) * int(np.prod(sizes))).reshape((n,) + (1,) * len(out)).astype(np.float64))
    y = _sum_of_taps(b, table, base, per_axis, sizes, rows)
    return b.transpose(y, (0, nd + 1) + tuple(range(1, nd + 1)))


def _sum_of_taps(b, table, base, per_axis, sizes, rows):
    """[*positions, C]: the table's rows at every combination of the axes' taps, weighted and
    summed; invalid taps read row `rows` (zeros)."""
    strides = [int(np.prod(sizes[a + 1:])) for a in range(len(sizes))]
    y = None
    for combo in itertools.product(*per_axis):
        ids, w, valid = base, None, None
        for (i, wa, va), st in zip(combo, strides):
            ids = ids + i * float(st)
            w = wa if w is None else (w if wa is None else w * wa)
            valid = va if valid is None else (valid if va is None else valid * va)
        if valid is not None:
            ids = b.op("where", valid, ids, float(rows))
        v = b.gather(table, b.op("cast", ids, to="i32"))
        term = v if w is None else v * b.reshape(w, w.shape + (1,))
        y = term if y is None else y + term
    return y


def _b_affine_grid(im, ins, at):
    """The base grid of normalised pixel centres (x, y[, z], 1) times theta transposed."""
    b, theta = im.b, im.tensor(ins[0])
    size = as_ints(im.known(ins[1], "size"))[2:]
    align = bool(at.get("align_corners", 0))
    axes = [np.linspace(-1.0, 1.0, d) if align and d > 1 else (2 * np.arange(d) + 1.0) / d - 1.0 for d in size]
    mesh = np.meshgrid(*axes, indexing="ij")
    base = np.stack([m.reshape(-1) for m in reversed(mesh)] + [np.ones(int(np.prod(size)))], axis=1)
    y = b.matmul(b.constant(base), theta, trans_b=True)  # [N, pixels, nd]
    return b.reshape(y, (theta.shape[0],) + tuple(size) + (len(size),))


def _b_col2im(im, ins, at):
    """Each kernel tap's column block, placed on the padded image with the strides, summed."""
    b, x = im.b, im.tensor(ins[0])
    image = as_ints(im.known(ins[1], "image_shape"))
    block = as_ints(im.known(ins[2], "block_shape"))
    nd = len(image)
    dil = as_ints(at.get("dilations", [1] * nd))
    pads = as_ints(at.get("pads", [0] * (2 * nd)))
    strides = as_ints(at.get("strides", [1] * nd))
    n, ck, length = x.shape
    taps = int(np.prod(block))
    c = ck // taps
    counts = [(image[i] + pads[i] + pads[nd + i] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    if int(np.prod(counts)) != length:
        raise ValueError(f"node {im.label!r}: Col2Im input has {length} blocks, the geometry gives {counts}")
    cols = b.reshape(x, (n, c, taps) + tuple(counts))
    padded = tuple(image[i] + pads[i] + pads[nd + i] for i in range(nd))
    total = None
    for t, offset in enumerate(itertools.product(*[range(k) for k in block])):
        tap = b.reshape(b.slice(cols, starts=(0, 0, t) + (0,) * nd, steps=(1,) * (nd + 3),
                                shape=(n, c, 1) + tuple(counts)), (n, c) + tuple(counts))
        placed = b.pad(tap, starts=(0, 0) + tuple(o * d for o, d in zip(offset, dil)), steps=(1, 1) + tuple(strides),
                       shape=(n, c) + padded, value=0.0)
        total = placed if total is None else total + placed
    if not any(pads):
        return total
    return b.slice(total, starts=(0, 0) + tuple(pads[:nd]), steps=(1,) * (nd + 2), shape=(n, c) + tuple(image))


def _b_deform_conv(im, ins, at):
    """Each kernel tap of each offset group sampled bilinearly (zeros outside) at its
    offset position, times the mask, then a grouped matmul with the weights."""
    b, x, w = im.b, im.tensor(ins[0]), im.tensor(ins[1])
    if len(x.shape) != 4:
        raise NotImplementedError(f"node {im.label!r}: DeformConv over {len(x.shape) - 2} spatial dimensions (only 2-D)")
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    k, groups, og = kh * kw, int(at.get("group", 1)), int(at.get("offset_group", 1))
    s, d = as_ints(at.get("strides", [1, 1])), as_ints(at.get("dilations", [1, 1]))
    p = as_ints(at.get("pads", [0, 0, 0, 0]))
    off = im.tensor(ins[2])
    oh, ow = off.shape[2:]
    if (h * wd + 1) * n >= EXACT_IDS:
        raise NotImplementedError(f"node {im.label!r}: DeformConv of {n * h * wd} pixels (at most 2^24)")
    off = b.reshape(off, (n, og, k, 2, oh, ow))
    mask = b.reshape(im.tensor(ins[4]), (n, og, k, oh, ow)) if len(ins) > 4 and ins[4] else None
    grid = [np.arange(oh)[:, None] * s[0] - p[0] + (np.arange(k) // kw * d[0])[:, None, None],
            np.arange(ow)[None, :] * s[1] - p[1] + (np.arange(k) % kw * d[1])[:, None, None]]  # [K, oh, ow]
    cpg = c // og
    base = b.constant((np.arange(n) * h * wd).reshape(n, 1, 1, 1).astype(np.float64))
    cols = []
    for g in range(og):
        part = b.slice(x, starts=(0, g * cpg, 0, 0), steps=(1,) * 4, shape=(n, cpg, h, wd)) if og > 1 else x
        table = b.pad(b.reshape(b.transpose(part, (0, 2, 3, 1)), (n * h * wd, cpg)), starts=(0, 0), steps=(1, 1),
                      shape=(n * h * wd + 1, cpg), value=0.0)
        per_axis = []
        for a, size in enumerate((h, wd)):
            shift = b.reshape(b.slice(off, starts=(0, g, 0, a, 0, 0), steps=(1,) * 6, shape=(n, 1, k, 1, oh, ow)),
                              (n, k, oh, ow))
            per_axis.append(_axis_taps(b, shift + b.constant(grid[a].astype(np.float64)), size, "linear", "zeros",
                                       0.0, size - 1.0))
        v = _sum_of_taps(b, table, base, per_axis, (h, wd), n * h * wd)  # [N, K, oh, ow, cpg]
        if mask is not None:
            m = b.slice(mask, starts=(0, g, 0, 0, 0), steps=(1,) * 5, shape=(n, 1, k, oh, ow))
            v = v * b.reshape(m, (n, k, oh, ow, 1))
        cols.append(v)
    cols = cols[0] if og == 1 else b.concat(*cols, axis=4)  # [N, K, oh, ow, C]
    cols = b.transpose(cols, (0, 2, 3, 4, 1))  # [N, oh, ow, C, K]
    outs = []
    for gi in range(groups):
        cg_cols = cols if groups == 1 else b.slice(cols, starts=(0, 0, 0, gi * cg, 0), steps=(1,) * 5,
                                                   shape=(n, oh, ow, cg, k))
        wg = w if groups == 1 else b.slice(w, starts=(gi * (oc // groups), 0, 0, 0), steps=(1,) * 4,
                                           shape=(oc // groups, cg, kh, kw))
        outs.append(b.matmul(b.reshape(cg_cols, (n * oh * ow, cg * k)), b.reshape(wg, (wg.shape[0], cg * k)),
                             trans_b=True))
    y = outs[0] if groups == 1 else b.concat(*outs, axis=1)
    y = b.transpose(b.reshape(y, (n, oh, ow, oc)), (0, 3, 1, 2))
    if len(ins) > 3 and ins[3]:
        y = y + b.reshape(im.tensor(ins[3]), (oc, 1, 1))
    return y


def _roi_samples(box, h, w, oh, ow, ratio):
    """(pixel ids [bins, S, 4], weights [bins, S, 4]) of one region's bilinear samples (S per
    bin; outside the map: weight 0), as the ONNX reference places them."""
    y0, x0, rh, rw = box
    gh = ratio or int(np.ceil(rh / oh))
    gw = ratio or int(np.ceil(rw / ow))
    ids, wts = np.zeros((oh * ow, gh * gw, 4), np.int64), np.zeros((oh * ow, gh * gw, 4))
    for bi, (ph, pw) in enumerate(itertools.product(range(oh), range(ow))):
        for si, (iy, ix) in enumerate(itertools.product(range(gh), range(gw))):
            y = y0 + ph * rh / oh + (iy + 0.5) * rh / oh / gh
            x = x0 + pw * rw / ow + (ix + 0.5) * rw / ow / gw
            if y < -1.0 or y > h or x < -1.0 or x > w:
                continue
            y, x = max(y, 0.0), max(x, 0.0)
            yl, xl = min(int(y), h - 1), min(int(x), w - 1)
            yh, xh = min(yl + 1, h - 1), min(xl + 1, w - 1)
            ly, lx = (y - yl if yl < h - 1 else 0.0), (x - xl if xl < w - 1 else 0.0)
            ids[bi, si] = [yl * w + xl, yl * w + xh, yh * w + xl, yh * w + xh]
            wts[bi, si] = [(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx]
    return ids, wts


def _b_roi_align(im, ins, at):
    """Average (or max) of bilinear samples in each bin of each region: the regions are
    known at import, so the sample pixels and weights are constants; the pixels are read
    with a gather of [N * H * W, C] rows."""
    b, x = im.b, im.tensor(ins[0])
    rois = np.asarray(im.known(ins[1], "the regions (rois)"), np.float64).reshape(-1, 4)
    batch = np.asarray(im.known(ins[2], "batch_indices")).astype(np.int64).reshape(-1)
    n, c, h, w = x.shape
    oh, ow = int(at.get("output_height", 1)), int(at.get("output_width", 1))
    ratio, scale = int(at.get("sampling_ratio", 0)), float(at.get("spatial_scale", 1.0))
    half = at.get("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    mode = at.get("mode", "avg")
    per_roi = []
    for r, (x1, y1, x2, y2) in enumerate(rois * scale - (0.5 if half else 0.0)):
        rh, rw = (y2 - y1, x2 - x1) if half else (max(y2 - y1, 1.0), max(x2 - x1, 1.0))
        ids, wts = _roi_samples((y1, x1, rh, rw), h, w, oh, ow, ratio)
        per_roi.append((ids + batch[r] * h * w, wts if mode == "max" else wts / max(ids.shape[1], 1)))
    most = max(ids.shape[1] for ids, _ in per_roi)
    # fewer samples: padded with copies of the first (max) or zero weights (avg)
    pad = [(np.concatenate([i] + [i[:, :1]] * (most - i.shape[1]), 1),
            np.concatenate([wt] + [wt[:, :1] * (mode == "max")] * (most - wt.shape[1]), 1)) for i, wt in per_roi]
    table = b.reshape(b.transpose(x, (0, 2, 3, 1)), (n * h * w, c))
    v = b.gather(table, b.constant_ids(np.stack([i for i, _ in pad])))  # [R, bins, S, 4, C]
    v = v * b.constant(np.stack([wt for _, wt in pad])[..., None])
    y = b.sum(v, [2, 3]) if mode == "avg" else b.max(b.max(v, [3]), [2])  # [R, bins, C]
    return b.transpose(b.reshape(y, (len(rois), oh, ow, c)), (0, 3, 1, 2))


# ----------------------------------------------------------- resize weights
def _source_coords(transform, n_in, n_out, scale, roi):
    """ONNX Resize's source coordinate of each output position along one axis, and (for
    tf_crop_and_resize) which of them fall outside the input."""
    o = np.arange(n_out, dtype=np.float64)
    width = scale * n_in  # the unrounded output length
    if transform == "align_corners":
        return (np.zeros(n_out) if width == 1 else o * (n_in - 1) / (width - 1)), None
    if transform == "asymmetric":
        return o / scale, None
    if transform == "tf_crop_and_resize":
        lo, hi = roi
        src = np.full(n_out, (hi - lo) * (n_in - 1) / 2) if width == 1 else o * (hi - lo) * (n_in - 1) / (width - 1)
        src = src + lo * (n_in - 1)
        return src, (src < 0) | (src > n_in - 1)
    if transform == "pytorch_half_pixel":
        return (np.full(n_out, -0.5) if width == 1 else (o + 0.5) / scale - 0.5), None
    if transform == "half_pixel":
        return (o + 0.5) / scale - 0.5, None
    if transform == "half_pixel_symmetric":  # the crop's centre kept at the output's centre
        return n_in / 2 * (1 - n_out / width) + (o + 0.5) / scale - 0.5, None
    raise NotImplementedError(f"Resize coordinate_transformation_mode {transform!r}")


def _tap_weights(mode, ratio, scale, a, antialias, nearest_mode):
    """The weights of the taps around a source coordinate at `ratio` in (0, 1] past a pixel."""
    if mode == "nearest":
        if ratio == 1:
            return np.array([0.0, 1.0])
        up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False,
              "ceil": True}[nearest_mode]
        return np.array([0.0, 1.0]) if up else np.array([1.0, 0.0])
    sc = min(scale, 1.0) if antialias else 1.0  # antialias stretches the kernel when downsampling
    if mode == "linear":
        start = int(np.floor(-1 / sc) + 1)
        w = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * sc), 0, 1)
    else:
        start = int(np.floor(-2 / sc) + 1)
        t = np.abs((np.arange(start, 2 - start) - ratio) * sc)
        w = np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                     np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))
    return w / w.sum() if antialias else w


def resize_weights(n_in, n_out, scale, mode, transform, roi=(0.0, 1.0), cubic_a=-0.75,
                   nearest_mode="round_prefer_floor", antialias=False, exclude_outside=False):
    """([n_out, n_in] weights, [n_out] mask of outputs that take the extrapolation value or
    None) of ONNX Resize along one axis, as its reference computes them: the taps nearest
    the source coordinate, edge-clamped (or with exclude_outside dropped and the rest
    renormalised)."""
    src, outside = _source_coords(transform, n_in, n_out, float(scale), roi)
    m = np.zeros((n_out, n_in))
    for o, x in enumerate(src):
        base = int(np.floor(x))
        w = _tap_weights(mode, 1.0 if x == base else x - base, float(scale), cubic_a, antialias, nearest_mode)
        k = len(w)
        pad = -(-k // 2)
        frac = x + pad - np.floor(x + pad)
        if k % 2 == 0:
            first = int(np.floor(x + pad)) + (-(k // 2) if frac == 0 else -(k // 2) + 1) - pad
        else:
            first = int(np.floor(x + pad)) + (-((k - 1) // 2) + (0 if frac <= 0.5 else 1)) - pad
        taps = first + np.arange(k)
        if exclude_outside:
            w = np.where((taps < 0) | (taps >= n_in), 0.0, w)
            w = w / (w.sum() or 1.0)
        np.add.at(m[o], np.clip(taps, 0, n_in - 1), w)
    if outside is not None:
        m[outside] = 0.0
    return m, outside if outside is not None and outside.any() else None


BUILD_SAMPLE = {
    "GridSample": _b_grid_sample,
    "AffineGrid": _b_affine_grid,
    "Col2Im": _b_col2im,
    "DeformConv": _b_deform_conv,
    "RoiAlign": _b_roi_align,
}
PARAM_INPUTS_SAMPLE = {"AffineGrid": (1,), "Col2Im": (1, 2), "RoiAlign": (1, 2)}

"""Graph builders for sampling at computed positions: GridSample, AffineGrid, Col2Im.

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
    strides = [int(np.prod(sizes[a + 1:])) for a in range(nd)]
    base = b.constant((np.arange(n) * int(np.prod(sizes))).reshape((n,) + (1,) * len(out)).astype(np.float64))
    y = None
    for combo in itertools.product(*per_axis):
        ids, w, valid = base, None, None
        for (i, wa, va), st in zip(combo, strides):
            ids = ids + i * float(st)
            w = wa if w is None else (w if wa is None else w * wa)
            valid = va if valid is None else (valid if va is None else valid * va)
        if valid is not None:
            ids = b.op("where", valid, ids, float(rows))
        v = b.gather(table, b.op("cast", ids, to="i32"))  # [N, *out, C]
        term = v if w is None else v * b.reshape(w, w.shape + (1,))
        y = term if y is None else y + term
    return b.transpose(y, (0, nd + 1) + tuple(range(1, nd + 1)))


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


BUILD_SAMPLE = {
    "GridSample": _b_grid_sample,
    "AffineGrid": _b_affine_grid,
    "Col2Im": _b_col2im,
}
PARAM_INPUTS_SAMPLE = {"AffineGrid": (1,), "Col2Im": (1, 2)}

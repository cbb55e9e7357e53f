"""Graph builders for signal processing (DFT, STFT; the window and mel matrices, folded
at import) and for the rounding and product ops on computed values (Floor, Ceil,
ReduceProd).

A DFT is a matmul with a constant matrix: a complex value is a trailing axis of 2 (real,
imaginary), a real one a trailing axis of 1, and the matrix maps the (sample, part) pairs
of a signal to the (frequency, part) pairs of its transform. STFT gathers its frames
with constant indices and applies the window (folded into the matrix when known).
"""
from __future__ import annotations

import numpy as np

from ..ir.builder import Tensor
from .common import Known

_EXACT = float(1 << 23)  # floats of this magnitude or more are integers


# --------------------------------------------------------------------- DFT
def _exact_zeros(v):
    """cos / sin of multiples of pi / 2 are 0 exactly (the others exceed 1e-6 for n < 10^6)."""
    return np.where(np.abs(v) < 1e-12, 0.0, v)


def dft_matrix(n_in, parts, n, inverse=False, onesided=False, window=None):
    """[n_in * parts, n_out * parts_out] float64: x (n_in samples of `parts` 1 or 2)
    times it is the length-n DFT of x (zero-padded or cut to n), as ONNX DFT computes
    it. Inverse divides by n; inverse and onesided is numpy's irfft (real output)."""
    if inverse and onesided:  # a half spectrum of a real signal -> the real signal
        k = np.arange(min(n_in, n // 2 + 1))[:, None]
        j = np.arange(n)[None, :]
        ang = 2 * np.pi * ((k * j) % n) / n
        w = np.where((k == 0) | (2 * k == n), 1.0, 2.0) / n
        re, im = w * _exact_zeros(np.cos(ang)), -w * _exact_zeros(np.sin(ang))
        im[(k[:, 0] == 0) | (2 * k[:, 0] == n)] = 0.0  # imaginary parts of DC and Nyquist are ignored
        rows = [re, im][:parts]
        out = np.zeros((n_in, parts, n))
        out[:k.shape[0]] = np.stack(rows, axis=1)
        return out.reshape(n_in * parts, n)
    n_out = n // 2 + 1 if onesided else n
    j = np.arange(min(n_in, n))[:, None]
    k = np.arange(n_out)[None, :]
    ang = 2 * np.pi * ((j * k) % n) / n
    c, s = _exact_zeros(np.cos(ang)), _exact_zeros(np.sin(ang))
    sign, scale = (1.0, 1.0 / n) if inverse else (-1.0, 1.0)
    # (xr + i xi)(c + i sign s) = (xr c - sign xi s) + i (xr sign s + xi c)
    m = np.zeros((n_in, 2, n_out, 2))
    m[:j.shape[0], 0, :, 0], m[:j.shape[0], 0, :, 1] = c, sign * s
    m[:j.shape[0], 1, :, 0], m[:j.shape[0], 1, :, 1] = -sign * s, c
    m = m[:, :parts] * scale
    if window is not None:
        m = m * np.asarray(window, np.float64).reshape(-1, 1, 1, 1)
    return m.reshape(n_in * parts, n_out * 2)


def _apply_matrix(b, x: Tensor, axis, matrix, parts_out):
    """x [..., N, ..., P] (the DFT axis `axis`) times the matrix over (N, P)."""
    rank = len(x.shape)
    perm = [a for a in range(rank - 1) if a != axis] + [axis, rank - 1]
    xt = b.transpose(x, perm)
    lead = xt.shape[:-2]
    rows = int(np.prod(lead)) if lead else 1
    y = b.matmul(b.reshape(xt, (rows, xt.shape[-2] * xt.shape[-1])), b.constant(matrix))
    y = b.reshape(y, lead + (matrix.shape[1] // parts_out, parts_out))
    return b.transpose(y, [perm.index(a) for a in range(rank)])


def _b_dft(im, ins, at):
    x = im.tensor(ins[0])
    rank = len(x.shape)
    if im.opset >= 20:
        axis = int(np.asarray(im.known(ins[2], "the axis")).reshape(())) if len(ins) > 2 and ins[2] else -2
    else:
        axis = int(at.get("axis", 1))
    axis %= rank
    if axis == rank - 1 or x.shape[-1] not in (1, 2):
        raise ValueError(f"node {im.label!r}: DFT over axis {axis} of {list(x.shape)} (the last axis holds "
                         "the real and imaginary parts)")
    inverse, onesided = bool(at.get("inverse", 0)), bool(at.get("onesided", 0))
    n_in = x.shape[axis]
    n = im.opt(ins, 1, "dft_length")
    n = int(np.asarray(n).reshape(())) if n is not None else (2 * (n_in - 1) if inverse and onesided else n_in)
    m = dft_matrix(n_in, x.shape[-1], n, inverse, onesided)
    return _apply_matrix(im.b, x, axis, m, 1 if inverse and onesided else 2)


def _b_stft(im, ins, at):
    """STFT: frames of frame_length every frame_step samples, windowed, transformed."""
    b = im.b
    x = im.tensor(ins[0])  # [B, L, P]
    bs, length, parts = x.shape
    step = int(np.asarray(im.known(ins[1], "frame_step")).reshape(()))
    win = im.env[ins[2]] if len(ins) > 2 and ins[2] else None
    fl = im.opt(ins, 3, "frame_length")
    win_len = (win.value.shape[0] if isinstance(win, Known) else win.shape[0]) if win is not None else None
    fl = int(np.asarray(fl).reshape(())) if fl is not None else win_len or length
    frames = 1 + (length - fl) // step
    if frames < 1:
        raise ValueError(f"node {im.label!r}: a signal of {length} has no frame of {fl}")
    ids = np.arange(frames)[:, None] * step + np.arange(fl)[None, :]
    table = b.reshape(b.transpose(x, (1, 0, 2)), (length, bs * parts))
    f = b.gather(table, b.constant_ids(ids))  # [F, fl, B * P]
    known_win = win.value if isinstance(win, Known) else None
    if win is not None and known_win is None:
        f = f * b.reshape(im.tensor(ins[2]), (1, fl, 1))
    f = b.transpose(b.reshape(f, (frames, fl, bs, parts)), (2, 0, 1, 3))  # [B, F, fl, P]
    m = dft_matrix(fl, parts, fl, onesided=bool(at.get("onesided", 1)), window=known_win)
    y = b.matmul(b.reshape(f, (bs * frames, fl * parts)), b.constant(m))
    return b.reshape(y, (bs, frames, m.shape[1] // 2, 2))


# ------------------------------------------------------- windows, mel matrix
def _window(kind):
    def build(im, ins, at):
        size = int(np.asarray(im.known(ins[0], "the window size")).reshape(()))
        n = size if at.get("periodic", 1) else size - 1
        t = 2 * np.pi * np.arange(size) / n
        if kind == "hann":
            w = np.sin(t / 2) ** 2
        elif kind == "hamming":
            w = 25 / 46 - (21 / 46) * np.cos(t)
        else:
            w = 0.42 - 0.5 * np.cos(t) + 0.08 * np.cos(2 * t)
        return _typed(w, at)
    return build


def _typed(value, at):
    from onnx import helper
    return value.astype(helper.tensor_dtype_to_np_dtype(int(at.get("output_datatype", 1))))


def mel_weight_matrix(bins, dft_length, rate, low, high):
    """[dft_length // 2 + 1, bins] triangular mel filters, as ONNX MelWeightMatrix."""
    mel = lambda hz: 2595 * np.log10(1 + hz / 700)
    lo, hi = mel(low), mel(high)
    pts = np.arange(bins + 2) * ((hi - lo) / (bins + 2)) + lo
    edges = (((dft_length + 1) * (700 * (10 ** (pts / 2595) - 1))) // rate).astype(int)
    out = np.zeros((dft_length // 2 + 1, bins))
    for i in range(bins):
        left, mid, right = edges[i:i + 3]
        if mid == left:
            out[mid, i] = 1.0
        else:
            out[left:mid + 1, i] = (np.arange(left, mid + 1) - left) / (mid - left)
        if right > mid:
            out[mid:right, i] = (right - np.arange(mid, right)) / (right - mid)
    return out


def _b_mel(im, ins, at):
    names = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")
    v = [np.asarray(im.known(n, what)).reshape(()) for n, what in zip(ins, names)]
    return _typed(mel_weight_matrix(int(v[0]), int(v[1]), int(v[2]), float(v[3]), float(v[4])), at)


# --------------------------------------------------- rounding, products
def floor(b, x: Tensor) -> Tensor:
    """floor(x), exactly: truncation through i32 below 2^23, x itself above (NaN stays);
    its gradient is 0 (a cast has none)."""
    t = b.op("cast", b.op("cast", x, to="i32"), to="f32")
    fl = t - b.step(t - x)
    return b.op("where", b.step(_EXACT - b.op("maximum", x, -x)), fl, b.op("cast", x, to="f32"))


def _b_floor(im, ins, at):
    return floor(im.b, im.tensor(ins[0]))


def _b_ceil(im, ins, at):
    return -floor(im.b, -im.tensor(ins[0]))


def _product(b, x: Tensor, axis) -> Tensor:
    """The product over one axis (kept, size 1): halves multiplied pairwise, an odd
    length padded with a 1."""
    while x.shape[axis] > 1:
        n = x.shape[axis]
        rank = len(x.shape)
        if n % 2:
            shape = tuple(n + 1 if a == axis else d for a, d in enumerate(x.shape))
            x = b.pad(x, starts=(0,) * rank, steps=(1,) * rank, shape=shape, value=1.0)
            n += 1
        half = tuple(n // 2 if a == axis else d for a, d in enumerate(x.shape))
        second = tuple(n // 2 if a == axis else 0 for a in range(rank))
        x = b.slice(x, starts=(0,) * rank, steps=(1,) * rank, shape=half) * b.slice(
            x, starts=second, steps=(1,) * rank, shape=half)
    return x


def _b_reduce_prod(im, ins, at):
    b, x = im.b, im.tensor(ins[0])
    axes = im.axes(ins, at, len(x.shape))
    if axes is None:
        if at.get("noop_with_empty_axes", 0):
            return x
        axes = list(range(len(x.shape)))
    if any(x.shape[a] == 0 for a in axes):
        raise NotImplementedError(f"node {im.label!r}: reduction of an empty tensor")
    for a in axes:
        x = _product(b, x, a)
    if not at.get("keepdims", 1):
        x = b.reshape(x, tuple(d for a, d in enumerate(x.shape) if a not in axes))
    return x


BUILD_SIGNAL = {
    "DFT": _b_dft,
    "STFT": _b_stft,
    "HannWindow": _window("hann"),
    "HammingWindow": _window("hamming"),
    "BlackmanWindow": _window("blackman"),
    "MelWeightMatrix": _b_mel,
    "Floor": _b_floor,
    "Ceil": _b_ceil,
    "ReduceProd": _b_reduce_prod,
}

SIGNAL_PARAM_INPUTS = {"DFT": (1, 2), "STFT": (1, 3), "HannWindow": (0,), "HammingWindow": (0,),
                       "BlackmanWindow": (0,), "MelWeightMatrix": (0, 1, 2, 3, 4)}

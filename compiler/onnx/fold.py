"""Folding with numpy: ops whose inputs are all known at import time (shape arithmetic,
constants). Each entry takes (importer, input arrays (None where absent), attributes)."""
from __future__ import annotations

import math

import numpy as np

from .common import flatten_shape, as_ints, np_dtype, reshape_target, squeeze_shape, unsqueeze_shape


def _int_div(a, c):
    if a.dtype.kind in "iub" and c.dtype.kind in "iub":
        return (np.sign(a) * np.sign(c) * (np.abs(a) // np.abs(c))).astype(np.result_type(a, c))
    return a / c


def _fold_slice(im, xs, at):
    x = xs[0]
    if len(xs) > 1:
        starts, ends = xs[1], xs[2]
        axes = xs[3] if len(xs) > 3 and xs[3] is not None else range(len(starts))
        steps = xs[4] if len(xs) > 4 and xs[4] is not None else [1] * len(starts)
    else:
        starts, ends = at["starts"], at["ends"]
        axes, steps = at.get("axes", range(len(starts))), [1] * len(starts)
    idx = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        idx[int(a) % x.ndim] = slice(int(s), int(e), int(st))
    return x[tuple(idx)]


def _fold_reduce(fn):
    def fold(im, xs, at):
        axes = at.get("axes", xs[1] if len(xs) > 1 and xs[1] is not None and xs[1].size else None)
        if axes is None and at.get("noop_with_empty_axes", 0):
            return xs[0]
        axes = None if axes is None else tuple(int(a) for a in np.asarray(axes).reshape(-1))
        return fn(xs[0], axis=axes, keepdims=bool(at.get("keepdims", 1)))
    return fold


def _fold_axes(xs, at):
    axes = at.get("axes", xs[1] if len(xs) > 1 and xs[1] is not None else None)
    return None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]


def _variadic(fn):
    def fold(im, xs, at):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out
    return fold


def _cof(im, xs, at):
    fill = at.get("value", np.zeros(1, np.float32))
    return np.full(tuple(int(d) for d in xs[0]), fill.reshape(-1)[0], fill.dtype)


def split_sizes(im, d, xs, at):
    if len(xs) > 1 and xs[1] is not None:
        return as_ints(xs[1])
    if "split" in at:
        return as_ints(at["split"])
    n = int(at.get("num_outputs", len(im.node.output)))
    chunk = -(-d // n)
    return [min(chunk, d - i * chunk) for i in range(n)]


def _fold_split(im, xs, at):
    x = xs[0]
    axis = int(at.get("axis", 0)) % x.ndim
    cuts = np.cumsum(split_sizes(im, x.shape[axis], xs, at))[:-1]
    return np.split(x, cuts, axis=axis)


def _fold_pad(im, xs, at):
    x = xs[0]
    if at.get("mode", "constant") != "constant":
        raise NotImplementedError(f"Pad mode {at.get('mode')!r}")
    pads = as_ints(xs[1] if len(xs) > 1 else at["pads"])
    value = xs[2].reshape(-1)[0] if len(xs) > 2 and xs[2] is not None and xs[2].size else at.get("value", 0)
    axes = as_ints(xs[3]) if len(xs) > 3 and xs[3] is not None else list(range(x.ndim))
    width = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        width[a % x.ndim] = (pads[i], pads[i + len(axes)])
    crop = tuple(slice(max(-lo, 0), x.shape[a] - max(-hi, 0)) for a, (lo, hi) in enumerate(width))
    return np.pad(x[crop], [(max(lo, 0), max(hi, 0)) for lo, hi in width], constant_values=value)


_erf = np.vectorize(math.erf, otypes=[np.float64])

FOLD = {
    "Constant": lambda im, xs, at: _constant(at),
    "Identity": lambda im, xs, at: xs[0],
    "Dropout": lambda im, xs, at: xs[0],
    "Cast": lambda im, xs, at: xs[0].astype(np_dtype(at["to"])),
    "CastLike": lambda im, xs, at: xs[0].astype(xs[1].dtype),
    "Reshape": lambda im, xs, at: xs[0].reshape(reshape_target(xs[0].shape, xs[1], at.get("allowzero", 0))),
    "Flatten": lambda im, xs, at: xs[0].reshape(flatten_shape(xs[0].shape, at.get("axis", 1))),
    "Transpose": lambda im, xs, at: np.transpose(xs[0], at.get("perm")),
    "Unsqueeze": lambda im, xs, at: xs[0].reshape(unsqueeze_shape(xs[0].shape, _fold_axes(xs, at))),
    "Squeeze": lambda im, xs, at: xs[0].reshape(squeeze_shape(xs[0].shape, _fold_axes(xs, at))),
    "Gather": lambda im, xs, at: np.take(xs[0], xs[1].astype(np.int64), axis=at.get("axis", 0)),
    "Concat": lambda im, xs, at: np.concatenate([x for x in xs if x is not None], axis=at["axis"]),
    "Split": _fold_split,
    "Slice": _fold_slice,
    "Pad": _fold_pad,
    "Tile": lambda im, xs, at: np.tile(xs[0], as_ints(xs[1])),
    "ConstantOfShape": _cof,
    "EyeLike": lambda im, xs, at: np.eye(*xs[0].shape, k=int(at.get("k", 0)),
                                         dtype=np_dtype(at["dtype"]) if "dtype" in at else xs[0].dtype),
    "Range": lambda im, xs, at: np.arange(*(np.asarray(v).reshape(-1)[0] for v in xs[:3])).astype(xs[0].dtype),
    "Expand": lambda im, xs, at: np.broadcast_to(
        xs[0], np.broadcast_shapes(xs[0].shape, tuple(int(d) for d in xs[1]))).copy(),
    "Where": lambda im, xs, at: np.where(xs[0], xs[1], xs[2]),
    "Equal": lambda im, xs, at: np.equal(xs[0], xs[1]),
    "Less": lambda im, xs, at: np.less(xs[0], xs[1]),
    "Greater": lambda im, xs, at: np.greater(xs[0], xs[1]),
    "LessOrEqual": lambda im, xs, at: np.less_equal(xs[0], xs[1]),
    "GreaterOrEqual": lambda im, xs, at: np.greater_equal(xs[0], xs[1]),
    "Not": lambda im, xs, at: np.logical_not(xs[0]),
    "And": lambda im, xs, at: np.logical_and(xs[0], xs[1]),
    "Or": lambda im, xs, at: np.logical_or(xs[0], xs[1]),
    "Xor": lambda im, xs, at: np.logical_xor(xs[0], xs[1]),
    "Add": lambda im, xs, at: xs[0] + xs[1],
    "Sub": lambda im, xs, at: xs[0] - xs[1],
    "Mul": lambda im, xs, at: xs[0] * xs[1],
    "Div": lambda im, xs, at: _int_div(xs[0], xs[1]),
    "Mod": lambda im, xs, at: np.fmod(xs[0], xs[1]) if at.get("fmod") else np.mod(xs[0], xs[1]),
    "Pow": lambda im, xs, at: np.power(xs[0], xs[1]).astype(xs[0].dtype),
    "Neg": lambda im, xs, at: -xs[0],
    "Abs": lambda im, xs, at: np.abs(xs[0]),
    "Sign": lambda im, xs, at: np.sign(xs[0]),
    "Floor": lambda im, xs, at: np.floor(xs[0]),
    "Ceil": lambda im, xs, at: np.ceil(xs[0]),
    "Round": lambda im, xs, at: np.round(xs[0]),
    "Sqrt": lambda im, xs, at: np.sqrt(xs[0]),
    "Exp": lambda im, xs, at: np.exp(xs[0]),
    "Log": lambda im, xs, at: np.log(xs[0]),
    "Sin": lambda im, xs, at: np.sin(xs[0]),
    "Cos": lambda im, xs, at: np.cos(xs[0]),
    "Relu": lambda im, xs, at: np.maximum(xs[0], 0),
    "Sigmoid": lambda im, xs, at: 1 / (1 + np.exp(-xs[0])),
    "Tanh": lambda im, xs, at: np.tanh(xs[0]),
    "Erf": lambda im, xs, at: _erf(xs[0]).astype(xs[0].dtype),
    "Reciprocal": lambda im, xs, at: 1 / xs[0],
    "Max": _variadic(np.maximum),
    "Min": _variadic(np.minimum),
    "Sum": _variadic(np.add),
    "ReduceSum": _fold_reduce(np.sum),
    "ReduceMean": _fold_reduce(np.mean),
    "ReduceMax": _fold_reduce(np.max),
    "ReduceMin": _fold_reduce(np.min),
    "ReduceProd": _fold_reduce(np.prod),
}


def _constant(at):
    if "value" in at:
        return at["value"]
    for key, dt in (("value_float", np.float32), ("value_floats", np.float32),
                    ("value_int", np.int64), ("value_ints", np.int64)):
        if key in at:
            return np.array(at[key], dt)
    raise NotImplementedError(f"Constant with attributes {sorted(at)} is not supported")

"""A Session's inputs and written weights, checked before they reach the GPU: shapes, dtypes,
finite values, the rows of a batch."""
from __future__ import annotations

import numpy as np

from .format import F16_MAX


def fits(t, v):
    """`t` (a records.TensorInfo) can hold `v`: refuse values an f16 tensor cannot hold (beyond 65504 they would become infinite)."""
    if t.dtype == "f16" and v.dtype != np.float16 and np.abs(v).max(initial=0.0) > F16_MAX:
        raise ValueError(f"{t.role} {t.name!r} is stored in half precision (compiled with f16 weights) and "
                         f"cannot hold values beyond {F16_MAX:g}")


def rows(inputs):
    firsts = {np.shape(v)[0] for v in inputs.values() if np.ndim(v) > 0}
    return firsts.pop() if len(firsts) == 1 else None


def pad(v, start, b):
    v = np.asarray(v)
    part = v[start:start + b]
    if part.shape[0] == b:
        return part
    zeros = np.zeros((b - part.shape[0],) + part.shape[1:], dtype=part.dtype)
    return np.concatenate([part, zeros])


def coerce(name, value, t, check_finite=True):
    """`value` as input `name` (tensor `t`, a records.TensorInfo) takes it, checked."""
    arr = np.asarray(value)
    if arr.shape != t.shape:
        raise ValueError(f"input {name!r} has shape {list(arr.shape)}; the model expects {list(t.shape)}")
    if t.dtype == "i32":
        if arr.dtype.kind not in "iub":
            raise TypeError(f"input {name!r} holds {arr.dtype} values; it takes integers")
        if arr.size and (arr.min() < -(2 ** 31) or arr.max() >= 2 ** 31):
            raise ValueError(f"input {name!r} has values outside the 32-bit range")
        return arr.astype(np.int32)
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"input {name!r} holds {arr.dtype} values; it takes numbers")
    arr = arr.astype(np.float32)
    if check_finite and not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ValueError(f"input {name!r} holds NaN or infinity (first at index {tuple(int(i) for i in bad)}, "
                         f"{arr[tuple(bad)]}); pass check_finite=False to allow it")
    return arr

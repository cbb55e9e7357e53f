"""Narrow element types a model's inputs and outputs may have (float8, float4, e8m0, 4- and 2-bit
integers), computed as f32 / i32 on the GPU: rounding into them at the boundary, in numpy.

Names are ml_dtypes' (what `onnx.numpy_helper.to_array` returns), so a caller's ml_dtypes array
converts by its dtype's name; without ml_dtypes, float32 / int32 arrays of the values work the same.
"""
from __future__ import annotations

import numpy as np

# float formats: (mantissa bits, least normal exponent, greatest finite value, has infinities,
# "fnuz": one NaN and no negative zero); conversion saturates as ONNX Cast does by default
FLOATS = {"float8_e4m3fn": (3, -6, 448.0, False, False), "float8_e4m3fnuz": (3, -7, 240.0, False, True),
          "float8_e5m2": (2, -14, 57344.0, True, False), "float8_e5m2fnuz": (2, -15, 57344.0, False, True),
          "float4_e2m1fn": (1, 0, 6.0, False, False)}
# integer formats: (least, greatest)
INTS = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}
NARROW = frozenset(FLOATS) | frozenset(INTS) | {"float8_e8m0fnu"}


def round_float(x, name: str, saturate: bool = True, keep_inf: bool = False) -> np.ndarray:
    """`x` rounded to the nearest value of float format `name` (ties to even), as float32.

    Beyond the greatest finite value: that value (`saturate`), else infinity where the format
    has one and NaN where not; infinities as the values beyond, unless `keep_inf` and the format
    has them (then every value it holds stays as it is). NaN stays NaN, except in float4_e2m1fn,
    which has none: it becomes 0 (as ml_dtypes converts it)."""
    mant, emin, top, has_inf, fnuz = FLOATS[name]
    with np.errstate(invalid="ignore", over="ignore"):
        x = np.asarray(x, np.float64)
        a = np.abs(x)
        _, e = np.frexp(np.where(np.isfinite(a), a, 1.0))
        q = np.ldexp(1.0, np.maximum(e - 1, emin) - mant)  # the spacing of the format's values near a
        r = np.round(a / q) * q
        kept = np.isinf(a) & has_inf & keep_inf
        over = (r > top) & ~kept
        r = np.where(over, top if saturate else (np.inf if has_inf else np.nan), np.where(kept, np.inf, r))
        r = np.where(np.isnan(x), 0.0 if name == "float4_e2m1fn" else np.nan, r)
    r = np.where(x < 0, -r, r) if fnuz else np.copysign(r, x)
    return r.astype(np.float32)


def round_e8m0(x) -> np.ndarray:
    """`x` rounded up to a power of two in [2^-127, 2^127] (float8_e8m0fnu, ONNX Cast's default
    `round_mode="up"` with saturation; 0 becomes 2^-127), as float32; NaN and infinities become
    NaN. The format has no sign: the magnitude is rounded, as the ONNX reference does."""
    with np.errstate(invalid="ignore"):
        a = np.abs(np.asarray(x, np.float64))
        m, e = np.frexp(np.where(np.isfinite(a), a, 1.0))
        k = np.clip(np.where(m == 0.5, e - 1, e), -127, 127)  # a power of two stays, others round up
    return np.where(np.isfinite(a), np.ldexp(1.0, np.where(a == 0, -127, k)), np.nan).astype(np.float32)


def wrap_int(v, name: str) -> np.ndarray:
    """Integers wrapped into a 4- or 2-bit type (higher bits dropped, as ONNX casts integers)."""
    lo, hi = INTS[name]
    span = hi - lo + 1
    return ((np.asarray(v, np.int64) - lo) % span + lo).astype(np.int32)


def to_source(arr: np.ndarray, name: str) -> np.ndarray:
    """An output as read from the GPU (f32 or i32) in the narrow type `name`: values the type
    holds stay (a Cast in the graph rounded them, saturating or not, as it said); others round
    as Cast does by default."""
    if name in INTS:
        return wrap_int(arr, name)
    return round_e8m0(arr) if name == "float8_e8m0fnu" else round_float(arr, name, keep_inf=True)

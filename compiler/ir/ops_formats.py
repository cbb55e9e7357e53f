"""The op table row that rounds f32 values into a narrow number format: float8, float4, e8m0,
and the 4- and 2-bit integers.

`round_to_format(x, kind=...)` keeps f32 (a Cast to float8 followed by more math sees the
rounded value; the runtime converts at the graph's boundary, runtime/formats.py). Kinds:
  float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz, float4_e2m1fn
      to nearest, ties to even; beyond the greatest finite value it saturates, as ONNX Cast
      does by default (infinities too); `<name>_unsaturated`: infinity where the format has
      one, else NaN (Cast's saturate=0). float4_e2m1fn has no NaN: NaN becomes 0.
  float8_e8m0fnu   up to a power of two in [2^-127, 2^127] (Cast's round_mode="up", saturating)
  int4, uint4, int2, uint2   toward zero; 0 outside the type's range and for NaN (a float Cast
      out of range is undefined in ONNX; this is what its reference, through ml_dtypes, gives)
The WGSL works on the bits (exact on any device, whatever it does with subnormals); the numpy
reference on frexp, independently. Not differentiable: rounding's derivative is 0 almost
everywhere (quantization-aware training would want a straight-through estimator instead).
"""
from __future__ import annotations

import numpy as np

from .ops import EW, NOT_DIFFERENTIABLE, row, same_shape

# (mantissa bits, least normal exponent, greatest finite value, has infinities, "fnuz": no negative zero)
FLOATS = {"float8_e4m3fn": (3, -6, 448.0, False, False), "float8_e4m3fnuz": (3, -7, 240.0, False, True),
          "float8_e5m2": (2, -14, 57344.0, True, False), "float8_e5m2fnuz": (2, -15, 57344.0, False, True),
          "float4_e2m1fn": (1, 0, 6.0, False, False)}
INTS = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}
UNSATURATED = "_unsaturated"


def _float_ref(x, name, saturate):
    mant, emin, top, has_inf, fnuz = FLOATS[name]
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.abs(x.astype(np.float64))
        _, e = np.frexp(np.where(np.isfinite(a), a, 1.0))
        q = np.ldexp(1.0, np.maximum(e - 1, emin) - mant)
        r = np.round(a / q) * q
        r = np.where(r > top, top if saturate else (np.inf if has_inf else np.nan), r)
        r = np.where(np.isnan(x), 0.0 if name == "float4_e2m1fn" else np.nan, r)
    return np.where(x < 0, -r, r) if fnuz else np.copysign(r, x)


def _e8m0_ref(x):
    with np.errstate(invalid="ignore"):
        a = np.abs(x.astype(np.float64))
        m, e = np.frexp(np.where(np.isfinite(a), a, 1.0))
        k = np.clip(np.where(m == 0.5, e - 1, e), -127, 127)
    return np.where(np.isfinite(a), np.ldexp(1.0, np.where(a == 0, -127, k)), np.nan)


def _int_ref(x, name):
    lo, hi = INTS[name]
    with np.errstate(invalid="ignore"):
        t = np.trunc(x)
        return np.where((t >= lo) & (t <= hi), t, 0.0)


def _reference(xs, at):
    x, kind = xs[0], at["kind"]
    if kind in INTS:
        out = _int_ref(x, kind)
    elif kind == "float8_e8m0fnu":
        out = _e8m0_ref(x)
    else:
        name = kind.removesuffix(UNSATURATED)
        out = _float_ref(x, name, name == kind)
    return out.astype(x.dtype)


# ------------------------------------------------------------------- WGSL
_BITS = "bitcast<u32>({0})"
_SIGN = f"({_BITS} & 0x80000000u)"


def _float_wgsl(name, saturate):
    """`round(|x| / q) * q` with q the spacing of the format's values at x's binade (a power of
    two made from x's exponent bits), then overflow, NaN and the sign."""
    mant, emin, top, has_inf, fnuz = FLOATS[name]
    q = f"bitcast<f32>(u32(max(i32(({_BITS} >> 23u) & 0xffu) - 127, {emin}) + {127 - mant}) << 23u)"
    r = f"(round(abs({{0}}) / {q}) * {q})"
    # infinity and NaN made from x's bits: a constant one would be refused by the WGSL compiler
    special = f"bitcast<f32>(({_BITS} & 0u) | {'0x7f800000u' if has_inf else '0x7fc00000u'})"
    over = f"{top!r}" if saturate else special
    nan = "0.0" if name == "float4_e2m1fn" else f"bitcast<f32>(({_BITS} & 0u) | 0x7fc00000u)"
    mag = f"select(select({r}, {over}, {r} > {top!r}), {nan}, ({_BITS} & 0x7fffffffu) > 0x7f800000u)"
    if fnuz:
        return f"select({mag}, -{mag}, {{0}} < 0.0 && {mag} > 0.0)"
    return f"bitcast<f32>(bitcast<u32>({mag}) | {_SIGN})"


def _e8m0_wgsl():
    """On the bits: a normal x rounds its exponent up when it has a fraction (up to 2^127); a
    subnormal or zero becomes 2^-127 (2^-126 above it); infinity and NaN become NaN."""
    e, f = f"(({_BITS} >> 23u) & 0xffu)", f"({_BITS} & 0x7fffffu)"
    normal = f"(({e} + select(0u, 1u, {f} > 0u && {e} < 254u)) << 23u)"
    small = f"select(0x00400000u, 0x00800000u, {f} > 0x400000u)"
    return f"bitcast<f32>(select(select({small}, {normal}, {e} > 0u), 0x7fc00000u, {e} == 255u))"


def _int_wgsl(name):
    lo, hi = INTS[name]
    return f"select(0.0, trunc({{0}}), trunc({{0}}) >= {float(lo)!r} && trunc({{0}}) <= {float(hi)!r})"


LOWERING = {"float8_e8m0fnu": _e8m0_wgsl()}
LOWERING.update({name: _int_wgsl(name) for name in INTS})
LOWERING.update({name: _float_wgsl(name, True) for name in FLOATS})
LOWERING.update({name + UNSATURATED: _float_wgsl(name, False) for name in FLOATS if name != "float4_e2m1fn"})


def _shape(nodes, at):
    assert nodes[0].dtype == "f32", "round_to_format takes f32 values"
    assert at["kind"] in LOWERING, f"unknown number format {at['kind']!r}"
    return same_shape(nodes, at)


row("round_to_format", _shape, _reference, None, (EW, LOWERING))
NOT_DIFFERENTIABLE.add("round_to_format")

"""Op conformance cases, part 5: round_to_format (compiler/ir/ops_formats.py), every kind, on
values that hit ties, the greatest finite value, overflow, subnormals, NaN and infinities,
against ml_dtypes' conversions (ONNX's saturate_cast and to_float8e8m0 where Cast differs)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx.numpy_helper import saturate_cast, to_float8e8m0
from op_cases import FWD_CASES, FwdCase, _rng

FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
SPECIAL = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e30, -1e30, 1e-30, 1e-45]


def held(name) -> np.ndarray:
    """Every finite value of float format `name`."""
    if name == "float4_e2m1fn":
        v = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6.0])
        return np.unique(np.concatenate([v, -v]))
    v = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, name)).astype(np.float64)
    return np.unique(v[np.isfinite(v)])


def probes(name) -> np.ndarray:
    """The format's values, the midpoints between neighbours (ties), one f32 step either side of
    each midpoint, values beyond the greatest, and the special values (float32-representable)."""
    v = held(name)
    mid = (v[1:] + v[:-1]) / 2
    m32 = mid.astype(np.float32)
    out = np.concatenate([v, mid, np.nextafter(m32, np.float32(np.inf)), np.nextafter(m32, np.float32(-np.inf)),
                          v.max() * np.array([1.03, 1.2, 2.0, -1.03, -2.0]), SPECIAL,
                          _rng(name).standard_normal(64) * v.max() / 4])
    return out.astype(np.float32).astype(np.float64)


def _want(name, saturate):
    dt = getattr(ml_dtypes, name)

    def ref(v):
        x = v["x"].astype(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            y = saturate_cast(x, dt) if saturate and name in FLOAT8 else x.astype(dt)
        return y.astype(np.float32).astype(np.float64)
    return ref


def _e8m0_want(v):
    x = v["x"].astype(np.float32)
    y = to_float8e8m0(x).astype(np.float32).astype(np.float64)
    # ONNX's reference rounds f32 subnormals (and 2^-127 itself) up to 2^-126; the row keeps 2^-127
    tiny = np.abs(x) <= 2.0 ** -127
    return np.where(tiny & np.isfinite(x), 2.0 ** -127, y)


def _int_want(name):
    dt = getattr(ml_dtypes, name)

    def ref(v):
        with np.errstate(invalid="ignore"):
            return v["x"].astype(np.float32).astype(dt).astype(np.float64)
    return ref


def _case(id, kind, x, ref):
    FWD_CASES.append(FwdCase(id, "round_to_format", {"x": x},
                             lambda b, t, kind=kind: b.op("round_to_format", t["x"], kind=kind), ref, True))


for _name in FLOAT8:
    _case(f"round_to_format-{_name}", _name, probes(_name), _want(_name, True))
    _case(f"round_to_format-{_name}-unsaturated", _name + "_unsaturated", probes(_name), _want(_name, False))
_case("round_to_format-float4_e2m1fn", "float4_e2m1fn", probes("float4_e2m1fn"), _want("float4_e2m1fn", True))
_E8 = np.array([0.0, 0.124, 0.25, 0.5, 1.1, 2.0, 4.0, 8.0, 3.0, 2.0 ** 127, 3e38, -6.0, 1e-38, np.nan, np.inf,
                2.0 ** -126, 2.0 ** -127, 1e-45], np.float32).astype(np.float64)
_case("round_to_format-float8_e8m0fnu", "float8_e8m0fnu", _E8, _e8m0_want)
for _name in ("int4", "uint4", "int2", "uint2"):
    _case(f"round_to_format-{_name}", _name, np.concatenate([np.arange(-20, 21) * 0.5, [7.9, -8.9, -0.7, 15.99, 16.0]]),
          _int_want(_name))

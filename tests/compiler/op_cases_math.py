"""Op conformance cases, part 5: the rows of compiler/ir/ops_math.py (elementary functions,
round, tensor powers, exact float remainders, bitcast), against torch autograd where
differentiable and numpy (float32 where the GPU's rounding is the point) where not."""
from __future__ import annotations

import numpy as np
import torch
from op_cases import (
    FWD_CASES,
    FwdCase,
    _rng,
    _sh,
    add_case,
    f32,
    normal,
    signed,
    uniform,
    with_values,
)

# kind -> (torch, domain)
UNARY = {
    "sin": (torch.sin, lambda r, s: with_values(uniform(r, -6, 6, s), [0.0, 1e-4, -3.1, 1.5707964])),
    "cos": (torch.cos, lambda r, s: with_values(uniform(r, -6, 6, s), [0.0, 1e-4, -3.1, 1.5707964])),
    "tan": (torch.tan, lambda r, s: with_values(uniform(r, -1.3, 1.3, s), [0.0, 1e-4, -1e-3])),
    "sinh": (torch.sinh, lambda r, s: with_values(normal(r, s, 3.0), [0.0, 1e-4, -0.99, 1.01, 9.0, -9.5])),
    "cosh": (torch.cosh, lambda r, s: with_values(normal(r, s, 3.0), [0.0, 1e-4, -0.99, 1.01, 9.0, -9.5])),
    "asin": (torch.asin, lambda r, s: with_values(uniform(r, -0.95, 0.95, s), [0.0, 1e-4, 0.499, -0.501, 0.95])),
    "acos": (torch.acos, lambda r, s: with_values(uniform(r, -0.95, 0.95, s), [0.0, 1e-4, 0.499, -0.501, 0.95])),
    "atan": (torch.atan, lambda r, s: with_values(normal(r, s, 3.0), [0.0, 0.41, 0.42, 2.41, -2.42, 30.0])),
    "asinh": (torch.asinh, lambda r, s: with_values(normal(r, s, 3.0), [0.0, 1e-4, 0.499, -0.501, 40.0])),
    "acosh": (torch.acosh, lambda r, s: with_values(uniform(r, 1.05, 6.0, s), [1.05, 1.499, 1.501, 40.0])),
    "atanh": (torch.atanh, lambda r, s: with_values(uniform(r, -0.95, 0.95, s), [0.0, 1e-4, 0.499, -0.501, 0.95])),
}
for _k, (_t, _dom) in UNARY.items():
    for _s in ((7, 13), (3, 5, 17)):
        _id = f"unary-{_k}-{_sh(_s)}"
        add_case(_id, "unary", {"a": _dom(_rng(_id), _s)}, lambda b, t, _k=_k: b.unary(t["a"], kind=_k),
                 lambda t, _t=_t: _t(t["a"]))

# round: halves to even, values one unit in the last place from a half, and past 2^23
_halves = f32([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, -0.49999997, 4194304.5, 8388607.5, -8388607.5,
               3e9, -0.0, 1e-30, 7.5, -7.49])
FWD_CASES.append(FwdCase("round-halves-16", "round", {"a": _halves}, lambda b, t: b.round(t["a"]),
                         lambda v: np.round(v["a"])))
FWD_CASES.append(FwdCase("round-7x13", "round", {"a": normal(_rng("round"), (7, 13), 5.0)},
                         lambda b, t: b.round(t["a"]), lambda v: np.round(v["a"])))

# power: both inputs differentiated (positive bases: log x exists), broadcast both ways
for _sa, _sb in (((7, 13), (7, 13)), ((5, 1), (1, 6)), ((3, 5, 17), ())):
    _id = f"power-{_sh(_sa)}-{_sh(_sb)}"
    _r = _rng(_id)
    add_case(_id, "power", {"a": uniform(_r, 0.2, 3.0, _sa), "b": normal(_r, _sb)},
             lambda b, t: b.power(t["a"], t["b"]), lambda t: torch.pow(t["a"], t["b"]))
# negative bases with whole exponents (and 0 to negative powers): products of the base, signs exact
_r = _rng("power-neg")
_x = with_values(signed(_r, 0.3, 2.0, (7, 13)), [0.0, -0.0, 0.0, 1.0, -1.0])
_y = f32(_r.integers(-5, 6, (7, 13)))
_y.reshape(-1)[:5] = [2.0, 3.0, 0.0, 1e9, 1e9 + 64]
FWD_CASES.append(FwdCase("power-negative-bases-7x13", "power", {"a": _x, "b": _y},
                         lambda b, t: b.power(t["a"], t["b"]),
                         lambda v: np.power(v["a"], v["b"]), exact=False))

# int_power: wrapping products, negative exponents (1 / x^n rounded toward zero)
_xi = np.array([2, 3, -3, 7, -1, 1, 0, 5, -2, 46341, 0, -1, 9], np.int32)
_ni = np.array([31, 4, 3, 20, -3, -5, 0, -1, 31, 2, 5, 1000000, 0], np.int32)


def _int_pow_np(x, n):
    return np.array([1 if b == 1 else (1 - 2 * (e & 1) if b == -1 else 0) if e < 0 else
                     (pow(int(b), int(e), 1 << 32) + (1 << 31)) % (1 << 32) - (1 << 31)
                     for b, e in zip(x, n)], np.int32)


FWD_CASES.append(FwdCase("int_power-13", "int_power", {"a": _xi, "b": _ni}, lambda b, t: b.int_power(t["a"], t["b"]),
                         lambda v: _int_pow_np(v["a"], v["b"])))

def _quiet(fn, *xs):
    with np.errstate(invalid="ignore", divide="ignore"):
        return fn(*xs)


# float_mod: quotients far past 2^24 (where x - y * trunc(x / y) is off), zeros, infinities, NaN
_r = _rng("float_mod")
_mx = f32(np.concatenate([[1e30, -1e30, 16777217.0, 3.0e9, 5.5, -5.5, 0.0, -0.0, 7.0, 3.0, np.inf, 1.0, np.nan, 2.0,
                           1e-30, 123456.79],
                          normal(_r, 48, 100.0)]))
_my = f32(np.concatenate([[3.1, 0.1, 0.3, -7.7, 2.0, 2.0, -2.0, 2.0, np.inf, -np.inf, 2.0, 0.0, 2.0, np.nan,
                           3e-31, -1e-3],
                          signed(_r, 0.1, 10.0, 48)]))
FWD_CASES.append(FwdCase("float_mod-trunc-64", "float_mod", {"a": _mx, "b": _my},
                         lambda b, t: b.float_mod(t["a"], t["b"], kind="trunc"),
                         lambda v: _quiet(np.fmod, v["a"], v["b"])))
# (the float64 interpreter rounds the divisor's addition in float64: compared to 1e-9 relative;
# test_onnx_math_ops.py compares the GPU's with numpy's float32 bit for bit)
_fin = np.isfinite(_mx) & np.isfinite(_my) & (_my != 0)
FWD_CASES.append(FwdCase("float_mod-floor-finite", "float_mod", {"a": _mx[_fin], "b": _my[_fin]},
                         lambda b, t: b.float_mod(t["a"], t["b"], kind="floor"),
                         lambda v: np.mod(v["a"], v["b"]), exact=False))

# bitcast: both ways, signs, infinity, -0.0
_bits = np.concatenate([[0, 1065353216, -1071644672, 0x7F800000, -(1 << 31)],
                        _rng("bitcast").integers(0x00800000, 0x7F000000, 25)]).astype(np.int32)
FWD_CASES.append(FwdCase("bitcast-f32-30", "bitcast", {"a": _bits},
                         lambda b, t: b.bitcast(t["a"], to="f32"), lambda v: v["a"].view(np.float32)))
FWD_CASES.append(FwdCase("bitcast-i32-7x13", "bitcast", {"a": with_values(normal(_rng("bitcast-i32"), (7, 13)),
                                                                          [0.0, -0.0, np.inf, -2.5, 1e-30])},
                         lambda b, t: b.bitcast(t["a"], to="i32"),
                         lambda v: v["a"].astype(np.float32).view(np.int32)))

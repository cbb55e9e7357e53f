"""Op table rows for elementary functions, powers with a tensor exponent and exact float
remainders. Same contract as ops.py (shape rule, numpy reference, gradient rule, lowering).

`unary` is one row for the trigonometric and hyperbolic functions and their inverses, the
function named by `kind`, each a prelude helper (a range reduction and a short polynomial,
relative error ~1e-7 over the f32 range): drivers' builtins may be approximations with an
absolute error (useless near a zero of the function), or textbook formulas that lose most
digits near 0 or overflow far from it.

`power` is x ** y elementwise: an integer-valued y multiplies out by squaring (exact signs for
negative bases, as PyTorch); `int_power` is the same on i32, wrapping as i32 products do.
`float_mod` is the exact remainder of floats: "trunc" (C's fmod: the dividend's sign) or
"floor" (numpy's and Python's %: the divisor's sign).
"""
from __future__ import annotations

import numpy as np

from .ops import EW, NOT_DIFFERENTIABLE, broadcast_shape, row


def _float_same(nodes, at):
    assert nodes[0].dtype == "f32", f"{at.get('kind', 'round')} takes floats"
    return "f32", nodes[0].shape


def _one_minus_sq(e, x):
    """1 - x^2 as (1 - x)(1 + x): exact near |x| = 1, where 1 - x * x cancels."""
    one = e.const(1.0)
    return e.op("mul", e.op("sub", one, x), e.op("add", one, x))


def _recip_sqrt(e, x):
    return e.op("div", e.const(1.0), e.op("sqrt", x))


# kind -> (numpy, WGSL, derivative (emitter, x, y) -> node)
UNARY = {
    "sin": (np.sin, "mn_sin({0})", lambda e, x, y: e.op("unary", x, kind="cos")),
    "cos": (np.cos, "mn_cos({0})", lambda e, x, y: e.op("neg", e.op("unary", x, kind="sin"))),
    "tan": (np.tan, "mn_tan({0})", lambda e, x, y: e.op("add", e.const(1.0), e.op("mul", y, y))),
    "sinh": (np.sinh, "mn_sinh({0})", lambda e, x, y: e.op("unary", x, kind="cosh")),
    "cosh": (np.cosh, "mn_cosh({0})", lambda e, x, y: e.op("unary", x, kind="sinh")),
    "asin": (np.arcsin, "mn_asin({0})", lambda e, x, y: _recip_sqrt(e, _one_minus_sq(e, x))),
    "acos": (np.arccos, "mn_acos({0})", lambda e, x, y: e.op("neg", _recip_sqrt(e, _one_minus_sq(e, x)))),
    "atan": (np.arctan, "mn_atan({0})",
             lambda e, x, y: e.op("div", e.const(1.0), e.op("add", e.const(1.0), e.op("mul", x, x)))),
    "asinh": (np.arcsinh, "mn_asinh({0})",
              lambda e, x, y: _recip_sqrt(e, e.op("add", e.op("mul", x, x), e.const(1.0)))),
    "acosh": (np.arccosh, "mn_acosh({0})", lambda e, x, y: _recip_sqrt(
        e, e.op("mul", e.op("sub", x, e.const(1.0)), e.op("add", x, e.const(1.0))))),
    "atanh": (np.arctanh, "mn_atanh({0})", lambda e, x, y: e.op("div", e.const(1.0), _one_minus_sq(e, x))),
}


def _unary_shape(nodes, at):
    assert at.get("kind") in UNARY, f"unknown function {at.get('kind')!r}"
    return _float_same(nodes, at)


def _g_unary(e, n, i, g):
    return [e.op("mul", g, UNARY[n.attr("kind")][2](e, n.inputs[0], i))]


row("unary", _unary_shape, lambda xs, at: UNARY[at["kind"]][0](xs[0]), _g_unary,
    (EW, {k: v[1] for k, v in UNARY.items()}))
# to the nearest integer, halves to the even one (numpy's and ONNX's Round; WGSL's round)
row("round", _float_same, lambda xs, at: np.round(xs[0]), None, (EW, "round({0})"))
NOT_DIFFERENTIABLE.add("round")


# -------------------------------------------------------------------- powers
def _power_shape(nodes, at):
    assert all(n.dtype == "f32" for n in nodes), "power takes floats (int_power: integers)"
    return broadcast_shape(nodes, at)


def _int_power_shape(nodes, at):
    assert all(n.dtype == "i32" for n in nodes), "int_power takes integers"
    return broadcast_shape(nodes, at)


def _g_power(e, n, i, g):
    """As torch.pow: d/dx = y x^(y-1) (0 where y = 0); d/dy = x^y log x (0 where x = 0 <= y)."""
    x, y = n.inputs
    zero = e.const(0.0)
    dx = e.op("mul", y, e.op("power", x, e.op("sub", y, e.const(1.0))))
    dx = e.op("where", e.op("eq", y, zero), zero, dx)
    x0 = e.op("mul", e.op("eq", x, zero), e.op("sub", e.const(1.0), e.op("step", e.op("neg", y))))
    dy = e.op("where", x0, zero, e.op("mul", i, e.op("log", x)))
    return [e.sum_to(e.op("mul", g, dx), e.shape(x)), e.sum_to(e.op("mul", g, dy), e.shape(y))]


def _int_power_ref(xs, at):
    """x ** n wrapped to 32 bits; a negative n gives 1 / x^|n| rounded toward zero (0 for x = 0)."""
    x, n = np.broadcast_arrays(np.asarray(xs[0], np.int64), np.asarray(xs[1], np.int64))
    mask = np.uint64(0xFFFFFFFF)  # products modulo 2^32 (in uint64: no overflow)
    out, base = np.ones(x.shape, np.uint64), x.astype(np.uint64) & mask
    k = np.where(n < 0, 0, n)
    while (k > 0).any():
        out = np.where(k & 1, (out * base) & mask, out)
        base, k = (base * base) & mask, k >> 1
    out = out.astype(np.uint32).view(np.int32)
    return np.where(n < 0, np.where(x == 1, 1, np.where(x == -1, 1 - 2 * (n & 1), 0)), out).astype(np.int32)


row("power", _power_shape, lambda xs, at: np.power(xs[0], xs[1]), _g_power, (EW, "mn_pow({0}, {1})"))
row("int_power", _int_power_shape, _int_power_ref, None, (EW, "mn_ipow({0}, {1})"))
NOT_DIFFERENTIABLE.add("int_power")


# ---------------------------------------------------------------- remainders
def _float_mod_shape(nodes, at):
    assert at.get("kind") in ("trunc", "floor"), f"float_mod kind {at.get('kind')!r}"
    assert all(n.dtype == "f32" for n in nodes), "float_mod takes floats (mod: integers)"
    return broadcast_shape(nodes, at)


def _float_mod_ref(xs, at):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.fmod(xs[0], xs[1]) if at["kind"] == "trunc" else np.mod(xs[0], xs[1])


row("float_mod", _float_mod_shape, _float_mod_ref, None,
    (EW, {"trunc": "mn_fmod({0}, {1})", "floor": "mn_floor_mod({0}, {1})"}))
NOT_DIFFERENTIABLE.add("float_mod")


# ------------------------------------------------------------------- bitcast
def _bitcast_shape(nodes, at):
    want = {"i32": "f32", "f32": "i32"}.get(at.get("to"))
    assert nodes[0].dtype == want, f"bitcast to {at.get('to')} takes {want}"
    return at["to"], nodes[0].shape


def _bitcast_ref(xs, at):
    if at["to"] == "i32":
        return np.asarray(xs[0], np.float32).view(np.int32)
    return np.asarray(xs[0], np.int32).view(np.float32)


# the same 32 bits read as the other type (ONNX BitCast)
row("bitcast", _bitcast_shape, _bitcast_ref, None, (EW, {"i32": "bitcast<i32>({0})", "f32": "bitcast<f32>({0})"}))
NOT_DIFFERENTIABLE.add("bitcast")

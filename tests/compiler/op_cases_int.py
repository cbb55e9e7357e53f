"""Op conformance cases, part 4: integer tensors (compiler/ir/ops_int.py, and the arithmetic
rows of ops.py on i32) and the ops whose outputs are indices, added to op_cases' lists.

Integer outputs must match numpy exactly (int64 arithmetic, wrapped to 32 bits where it
overflows, as WGSL's i32 does); topk's values are differentiated against torch.topk."""
from __future__ import annotations

import numpy as np
import torch

from op_cases import FWD_CASES, FwdCase, _rng, _sh, add_case, normal, with_values

I32 = np.int32


def _fwd(id, op, inputs, build, reference):
    FWD_CASES.append(FwdCase(id, op, inputs, build, reference, True))


def _ints(name, shape, lo=-50, hi=50):
    return _rng(name).integers(lo, hi, shape).astype(I32)


def _wrap(x):
    return np.asarray(x, np.int64).astype(I32)


def _trunc_div(a, b):
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    return np.where(b == 0, a, np.trunc(a / np.where(b == 0, 1, b)).astype(np.int64))


# --- the arithmetic rows on i32: wrapping products, division toward zero, x / 0 = x
_a, _b = _ints("i32-a", (7, 13), -3000, 3000), _ints("i32-b", (7, 13), -9, 9)
_a.reshape(-1)[:4] = [2 ** 31 - 1, -2 ** 31, 46341, -7]
_b.reshape(-1)[:4] = [2, -1, 46341, 0]
_fwd("add-i32-7x13", "add", {"a": _a, "b": _b}, lambda b, t: t["a"] + t["b"],
     lambda v: _wrap(v["a"] + v["b"].astype(np.int64)))
_fwd("sub-i32-7x13-scalar", "sub", {"a": _a}, lambda b, t: t["a"] - 5, lambda v: _wrap(v["a"] - np.int64(5)))
_fwd("mul-i32-7x13", "mul", {"a": _a, "b": _b}, lambda b, t: t["a"] * t["b"],
     lambda v: _wrap(v["a"] * v["b"].astype(np.int64)))
_fwd("div-i32-7x13", "div", {"a": _a, "b": _b}, lambda b, t: t["a"] / t["b"],
     lambda v: _wrap(_trunc_div(v["a"], v["b"])))
_fwd("maximum-i32-5x1-1x6", "maximum", {"a": _ints("mx-a", (5, 1)), "b": _ints("mx-b", (1, 6))},
     lambda b, t: b.maximum(t["a"], t["b"]), lambda v: np.maximum(v["a"], v["b"]))
_fwd("neg-i32-7x13", "neg", {"a": _a}, lambda b, t: -t["a"], lambda v: _wrap(-v["a"].astype(np.int64)))

# --- the rows of ops_int.py
_fwd("greater-i32-5x1-1x6", "greater", {"a": _ints("gt-a", (5, 1), -3, 3), "b": _ints("gt-b", (1, 6), -3, 3)},
     lambda b, t: b.greater(t["a"], t["b"]), lambda v: (v["a"] > v["b"]).astype(np.float32))
_fwd("greater-f32-7x13", "greater", {"a": with_values(normal(_rng("gtf"), (7, 13)), [0.0, -0.0, 1e-30])},
     lambda b, t: b.greater(t["a"], 0.0), lambda v: (v["a"] > 0).astype(np.float32))
_fwd("mod-i32-7x13", "mod", {"a": _a, "b": _b}, lambda b, t: b.mod(t["a"], t["b"]),
     lambda v: _wrap(np.where(v["b"] == 0, 0, v["a"] - v["b"].astype(np.int64) * _trunc_div(v["a"], v["b"]))))
_fwd("abs-i32-7x13", "abs", {"a": _a}, lambda b, t: b.abs(t["a"]), lambda v: np.abs(v["a"]))
_fwd("sign-i32-7x13", "sign", {"a": _a}, lambda b, t: b.sign(t["a"]), lambda v: np.sign(v["a"]))
_fwd("sign-f32-7x13", "sign", {"a": with_values(normal(_rng("sgn"), (7, 13)), [0.0, -0.0])},
     lambda b, t: b.sign(t["a"]), lambda v: np.sign(v["a"]).astype(np.float32))
for _k, _fn in (("and", np.bitwise_and), ("or", np.bitwise_or), ("xor", np.bitwise_xor)):
    _fwd(f"bitwise-{_k}-7x13-1x13", "bitwise", {"a": _a, "b": _ints(f"bw-{_k}", (1, 13), -99, 99)},
         lambda b, t, _k=_k: b.bitwise(t["a"], t["b"], kind=_k), lambda v, _fn=_fn: _fn(v["a"], v["b"]))
_s = np.array([0, 1, 5, 31, 32, 40, -1, -33, 3, 7, 30, 2, 31], I32)  # out of range: 0 left, the sign right
_x = np.array([1, -1, 77, 1, -5, 9, 12, -12, -2 ** 31, 2 ** 30, -3, 2 ** 31 - 1, -1], I32)
_fwd("bitwise-shl-13", "bitwise", {"a": _x, "b": _s}, lambda b, t: b.bitwise(t["a"], t["b"], kind="shl"),
     lambda v: np.where((v["b"] >= 0) & (v["b"] < 32), (v["a"].astype(np.int64) << np.clip(v["b"], 0, 31)), 0)
     .astype(np.int64).astype(I32))
_fwd("bitwise-shr-13", "bitwise", {"a": _x, "b": _s}, lambda b, t: b.bitwise(t["a"], t["b"], kind="shr"),
     lambda v: np.where((v["b"] >= 0) & (v["b"] < 32), v["a"] >> np.clip(v["b"], 0, 31), v["a"] >> 31).astype(I32))
_fwd("bit_not-7x13", "bit_not", {"a": _a}, lambda b, t: b.bit_not(t["a"]), lambda v: np.invert(v["a"]))

# --- argmax / argmin: ties to the first (or last) index, any axis, keepdims, integers too
_ties = np.array([[3, 1, 3, 0, 3], [-2, -2, 5, 5, -7], [0, 0, 0, 0, 0], [9, 8, 7, 6, 9]], I32)
_xf = normal(_rng("argmax"), (3, 5, 17))
for _id, _inp, _at, _ref in [
    ("argmax-f32-3x5x17-ax2", _xf, {"axis": 2}, lambda x: np.argmax(x, 2)),
    ("argmax-f32-3x5x17-ax1-keep", _xf, {"axis": 1, "keepdims": True}, lambda x: np.argmax(x, 1)[:, None]),
    ("argmin-f32-3x5x17-ax0", _xf, {"axis": 0, "smallest": True}, lambda x: np.argmin(x, 0)),
    ("argmax-i32-ties-first", _ties, {"axis": 1}, lambda x: np.argmax(x, 1)),
    ("argmax-i32-ties-last", _ties, {"axis": 1, "last": True}, lambda x: 4 - np.argmax(x[:, ::-1], 1)),
    ("argmin-i32-ties-last-ax0", _ties, {"axis": 0, "last": True, "smallest": True},
     lambda x: 3 - np.argmin(x[::-1], 0)),
]:
    _fwd(_id, "argmax", {"a": _inp}, lambda b, t, _at=_at: b.op("argmax", t["a"], **{"keepdims": False, **_at}),
         lambda v, _ref=_ref: _ref(v["a"]).astype(I32))


# --- topk: values (differentiable), indices, ties by lower index
def _topk_np(x, k, axis, largest):
    key = x.astype(np.int64) if x.dtype.kind == "i" else x
    order = np.argsort(-key if largest else key, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis), idx.astype(I32)


for _shape, _k, _axis, _largest in [((3, 5, 17), 4, 2, True), ((6, 9), 3, 0, False), ((11,), 11, 0, True)]:
    _id = f"topk-{_sh(_shape)}-k{_k}-ax{_axis}-{'largest' if _largest else 'smallest'}"
    add_case(_id, "topk", {"a": normal(_rng(_id), _shape)},
             lambda b, t, _k=_k, _axis=_axis, _l=_largest: b.topk(t["a"], _k, _axis, _l)[0],
             lambda t, _k=_k, _axis=_axis, _l=_largest: torch.topk(t["a"], _k, _axis, _l, True).values)
    _fwd(_id.replace("topk", "topk_indices"), "topk_indices", {"a": normal(_rng(_id), _shape)},
         lambda b, t, _k=_k, _axis=_axis, _l=_largest: b.topk(t["a"], _k, _axis, _l)[1],
         lambda v, _k=_k, _axis=_axis, _l=_largest: _topk_np(v["a"], _k, _axis, _l)[1])
_fwd("topk-i32-ties-4x5-k3", "topk", {"a": _ties}, lambda b, t: b.topk(t["a"], 3, 1)[0],
     lambda v: _topk_np(v["a"], 3, 1, True)[0])
_fwd("topk_indices-i32-ties-4x5-k3-smallest", "topk_indices", {"a": _ties},
     lambda b, t: b.topk(t["a"], 3, 1, largest=False)[1], lambda v: _topk_np(v["a"], 3, 1, False)[1])
# abs of floats: differentiable (sign(x) times the cotangent)
add_case("abs-7x13", "abs", {"a": with_values(normal(_rng("abs"), (7, 13)), [0.5, -0.5])},
         lambda b, t: b.abs(t["a"]), lambda t: torch.abs(t["a"]))

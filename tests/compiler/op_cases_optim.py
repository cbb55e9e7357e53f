"""Op conformance cases, part 3: the optimizer rows, against torch.optim.AdamW itself.

Each case starts torch's AdamW from given moments at a given step and compares one of
its results (new exp_avg, exp_avg_sq, or the weight's change) with the row's; with ok = 0
(a batch with a non-finite gradient) the row must return its old value bit for bit."""
from __future__ import annotations

import math

import numpy as np
import torch
from op_cases import FWD_CASES, FwdCase, _rng, f32, normal, with_values

LR, BETAS, EPS, WD = 3e-3, (0.9, 0.999), 1e-8, 0.01


def _torch_adamw(v, step):
    """torch's AdamW, one step from state (exp_avg m, exp_avg_sq s, `step` steps done)."""
    p = torch.tensor(v["p"], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.AdamW([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)
    p.grad = torch.tensor(v["g"], dtype=torch.float64)
    opt.state[p] = {"step": torch.tensor(float(step), dtype=torch.float64),
                    "exp_avg": torch.tensor(v["m"], dtype=torch.float64),
                    "exp_avg_sq": torch.tensor(v["s"], dtype=torch.float64)}
    opt.step()
    st = opt.state[p]
    return {"m": st["exp_avg"].numpy(), "s": st["exp_avg_sq"].numpy(), "p": p.detach().numpy()}


def _scalars(step):
    """The step's scalars as training.py computes them on the GPU, for step number step + 1
    (in float64: the interpreter matches torch to 1e-9; the GPU reads them rounded)."""
    t = step + 1
    return {"step_size": np.array(LR / (1 - BETAS[0] ** t)), "sqrt_c2": np.array(math.sqrt(1 - BETAS[1] ** t)),
            "decay": np.array(1 - LR * WD)}


def _update(b, t, which):
    ok = t["ok"]
    m2 = b.op("moving_average", t["m"], t["g"], ok, keep=BETAS[0], take=1 - BETAS[0])
    s2 = b.op("moving_average", t["s"], t["g"] * t["g"], ok, keep=BETAS[1], take=1 - BETAS[1])
    if which == "m":
        return m2
    if which == "s":
        return s2
    # the change to p, not p: the step is ~1e-3 of |p| and weight decay ~1% of the step, under
    # a tolerance relative to |p| (1e-4) a lowering without it would pass
    return b.op("adamw_update", t["p"], m2, s2, t["step_size"], t["sqrt_c2"], t["decay"], ok, eps=EPS) - t["p"]


for _shape, _step in (((7, 13), 0), ((3, 5, 17), 41)):
    _id = f"adamw-{'x'.join(map(str, _shape))}-step{_step}"
    _r = _rng(_id)
    _v = {"p": normal(_r, _shape), "g": normal(_r, _shape, 0.1), "m": normal(_r, _shape, 0.01),
          "s": f32(np.abs(normal(_r, _shape, 1e-3))), **_scalars(_step)}
    _v["g"] = with_values(_v["g"], [0.0, 1e-20, -3.0])
    for _op, _which in (("moving_average", "m"), ("moving_average", "s"), ("adamw_update", "p")):
        for _ok in (1.0, 0.0):
            _inputs = {**_v, "ok": np.array(_ok)}
            if not _ok:  # a rejected step: non-finite gradients, every value stays as it was
                _inputs["g"] = with_values(_v["g"], [np.nan, np.inf, -np.inf])
            _ref = (lambda v, _which=_which, _step=_step: _torch_adamw(v, _step)[_which] - (v["p"] if _which == "p" else 0)) \
                if _ok else (lambda v, _which=_which: v[_which] * (_which != "p"))
            FWD_CASES.append(FwdCase(f"{_id}-{_which}-ok{int(_ok)}", _op, _inputs,
                                     lambda b, t, _which=_which: _update(b, t, _which), _ref, exact=not _ok))


def _count_inputs(id, shapes, bad):
    """Tensors of `shapes` holding the extreme values `bad` (NaN, infinities) and finite ones
    as large as float32 goes."""
    r = _rng(id)
    out = {}
    for j, s in enumerate(shapes):
        x = normal(r, s, 1e30)
        x = with_values(x, bad[j]) if bad[j] else x
        out[f"x{j}"] = x
    return out


# one tensor, several of odd sizes (a scalar and an empty one among them), long enough to split
_COUNTS = [
    ("count_nonfinite-4x9", [(4, 9)], [[np.nan, 1.7e38, -np.inf]]),
    ("count_nonfinite-mixed", [(), (5, 7), (0,), (3, 1, 2)], [[], [np.inf, 3.0e38, np.nan, np.nan], [], [-np.inf]]),
    ("count_nonfinite-finite", [(7,), (2, 3)], [[3.4e38, -3.4e38, 1e-45], []]),
    ("count_nonfinite-split-3x70000", [(70001,), (3, 70000)], [[np.inf], [np.nan, -np.inf]]),
]
for _id, _shapes, _bad in _COUNTS:
    _n = len(_shapes)
    FWD_CASES.append(FwdCase(_id, "count_nonfinite", _count_inputs(_id, _shapes, _bad),
                             lambda b, t, _n=_n: b.op("count_nonfinite", *[t[f"x{j}"] for j in range(_n)]),
                             lambda v, _n=_n: np.array(float(sum(np.count_nonzero(~np.isfinite(v[f"x{j}"]))
                                                                 for j in range(_n))), np.float32)))

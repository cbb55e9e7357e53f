"""Op conformance cases, part 4: writes by index (scatter_reduce, index_put), against
torch's scatter, index_add and scatter_reduce (test_ops.py runs them)."""
from __future__ import annotations

import numpy as np
import torch
from op_cases import FWD_CASES, FwdCase, _rng, add_case, normal

_TORCH_REDUCE = {"mul": "prod", "max": "amax", "min": "amin"}


def _rows(idx, rows):
    return torch.as_tensor(np.asarray(idx, np.int64) % rows)


def _torch_index_put(t, red, rows):
    data, idx, upd = t["a"], _rows(t["idx"].numpy(), rows), t["u"]
    if red == "add":
        return data.index_add(0, idx, upd)
    if red == "none":
        return data.index_copy(0, idx, upd)
    return data.scatter_reduce(0, idx[:, None].expand(-1, upd.shape[1]), upd, _TORCH_REDUCE[red], include_self=True)


for _red in ("none", "add", "mul", "max", "min"):
    _id = f"index_put-{_red}-6x4"
    _r = _rng(_id)
    _idx = np.array([4, 0, -1, 2] if _red == "none" else [4, 0, -2, 4, 1, 4], np.int32)
    _u = normal(_r, (len(_idx), 4))
    if _red == "mul":
        _u[1, 2] = 0.0  # a single zero in its row: its gradient is the product of the others
    add_case(_id, "index_put", {"a": normal(_r, (6, 4)), "idx": _idx, "u": _u},
             lambda b, t, _red=_red: b.op("index_put", t["a"], t["idx"], t["u"], reduction=_red),
             lambda t, _red=_red: _torch_index_put(t, _red, 6), wrt=("a", "u"))

for _red in ("none", "mul", "max", "min"):
    _id = f"scatter_reduce-{_red}-7x3-rows5"
    _r = _rng(_id)
    _idx = np.array([[3, 0], [-1, 2]] if _red == "none" else [[3, 0, 3], [-2, 3, 0]], np.int32)
    _u = normal(_r, _idx.shape + (7,))
    FWD_CASES.append(FwdCase(
        _id, "scatter_reduce", {"a": _u, "idx": _idx},
        lambda b, t, _red=_red: b.op("scatter_reduce", t["a"], t["idx"], rows=5, reduction=_red),
        lambda v, _red=_red: torch.zeros(5, 7, dtype=torch.float64).scatter_reduce(
            0, _rows(v["idx"].reshape(-1, 1), 5).expand(-1, 7), torch.tensor(v["a"].reshape(-1, 7)),
            _TORCH_REDUCE.get(_red, "sum"), include_self=False).numpy(), exact=False))

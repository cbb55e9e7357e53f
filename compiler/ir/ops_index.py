"""Op table rows for writes by index: scatter with a reduction (none, mul, max, min) and
`index_put`, a differentiable put of update rows into a tensor (ONNX ScatterElements and
ScatterND). Reads by index are `gather` rows (ops_nn.py) with indices computed in the graph.

Both index a tensor's first axis, like `gather` / `scatter_add`: idx [...] of i32 picks a
row of data [R, *inner] for each update [..., *inner]; negative ids count from the end and
ids outside [-R, R) are skipped. Same contract as ops.py (shape rule, numpy reference,
gradient rule, lowering).
"""
from __future__ import annotations

import numpy as np

from .ops import NOT_DIFFERENTIABLE, row

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _rows_in(idx, rows):
    """(flat row ids, mask of the ids inside the table)."""
    flat = idx.reshape(-1).astype(np.int64)
    flat = np.where(flat < 0, flat + rows, flat)
    return flat, (flat >= 0) & (flat < rows)


# ------------------------------------------------------------ scatter_reduce
def _scatter_reduce_shape(nodes, at):
    upd, idx = nodes
    assert idx.dtype == "i32", "scatter indices are integers"
    assert upd.shape[:len(idx.shape)] == idx.shape, f"updates {upd.shape} do not start with the index shape {idx.shape}"
    assert at["reduction"] in ("none", "mul", "max", "min"), f"reduction {at['reduction']!r}"
    return "f32", (int(at["rows"]),) + upd.shape[len(idx.shape):]


def _scatter_reduce_ref(xs, at):
    """Rows that get updates hold them combined in index order ("none": the last one);
    the other rows are 0."""
    upd, idx = xs
    rows, red = int(at["rows"]), at["reduction"]
    inner = upd.shape[idx.ndim:]
    flat, inside = _rows_in(idx, rows)
    u = upd.reshape((-1,) + inner)[inside]
    flat = flat[inside]
    out = np.zeros((rows,) + inner, dtype=upd.dtype)
    if red == "none":
        last = len(flat) - 1 - np.unique(flat[::-1], return_index=True)[1]
        out[flat[last]] = u[last]
        return out
    ufunc = {"mul": np.multiply, "max": np.maximum, "min": np.minimum}[red]
    init = {"mul": 1.0, "max": -np.inf, "min": np.inf}[red]
    out[:] = init
    ufunc.at(out, flat, u)
    out[np.setdiff1d(np.arange(rows), flat)] = 0.0
    return out


row("scatter_reduce", _scatter_reduce_shape, _scatter_reduce_ref, None, ("kernel", "gather"))
NOT_DIFFERENTIABLE.add("scatter_reduce")


# ----------------------------------------------------------------- index_put
def _index_put_shape(nodes, at):
    data, idx, upd = nodes
    assert idx.dtype == "i32", "index_put indices are integers"
    assert data.dtype == upd.dtype == "f32", "index_put writes float tensors"
    assert upd.shape == idx.shape + data.shape[1:], \
        f"updates {upd.shape} != index shape {idx.shape} + row shape {data.shape[1:]}"
    assert at["reduction"] in REDUCTIONS, f"reduction {at['reduction']!r}"
    return "f32", data.shape


def _index_put_ref(xs, at):
    data, idx, upd = xs
    rows, red = data.shape[0], at["reduction"]
    flat, inside = _rows_in(idx, rows)
    if red == "add":
        out = data.copy()
        np.add.at(out, flat[inside], upd.reshape((-1,) + data.shape[1:])[inside])
        return out
    s = _scatter_reduce_ref([upd, idx], {"rows": rows, "reduction": red})
    touched = np.zeros((rows,) + (1,) * (data.ndim - 1), bool)
    touched[flat[inside]] = True
    combined = {"none": s, "mul": data * s, "max": np.maximum(data, s), "min": np.minimum(data, s)}[red]
    return np.where(touched, combined, data)


def _touched(e, data, idx):
    """[R, 1, ...]: 1 where a row gets an update."""
    ones = e.op("broadcast_to", e.const(1.0), shape=e.shape(idx) + (1,))
    count = e.op("scatter_add", ones, idx, rows=e.shape(data)[0])
    return e.reshape(e.op("step", count), (e.shape(data)[0],) + (1,) * (len(e.shape(data)) - 1))


def _d_index_put(e, n):
    data, idx, upd = n.inputs
    red = n.attr("reduction")
    rows = e.shape(data)[0]
    if red == "add":
        return e.op("add", data, e.op("scatter_add", upd, idx, rows=rows))
    s = e.op("scatter_reduce", upd, idx, rows=rows, reduction=red)
    if red == "none":
        combined = s
    elif red == "mul":
        combined = e.op("mul", data, s)
    elif red == "max":
        combined = e.op("maximum", data, s)
    else:
        combined = e.op("neg", e.op("maximum", e.op("neg", data), e.op("neg", s)))
    return e.op("where", _touched(e, data, idx), combined, data)


def _g_index_put(e, n, i, g):
    """As torch's scatter / scatter_reduce(include_self=True): an update's gradient is the
    output gradient at its row; max / min share it among the values equal to the result;
    mul's is the product of everything else in the row (a single zero update included)."""
    data, idx, upd = n.inputs
    red, rows = n.attr("reduction"), e.shape(data)[0]

    def take(t):
        return e.op("gather", t, idx)
    if red == "add":
        return [g, None, take(g)]
    if red == "none":
        return [e.op("mul", g, e.op("sub", e.const(1.0), _touched(e, data, idx))), None, take(g)]
    if red in ("max", "min"):
        hit_d, hit_u = e.op("eq", data, i), e.op("eq", upd, take(i))
        share = e.op("div", g, e.op("add", hit_d, e.op("scatter_add", hit_u, idx, rows=rows)))
        return [e.op("mul", hit_d, share), None, e.op("mul", hit_u, take(share))]
    ones = e.op("broadcast_to", e.const(1.0), shape=e.shape(data))
    zero = e.op("eq", upd, e.const(0.0))
    single = e.op("mul", zero, e.op("eq", take(e.op("scatter_add", zero, idx, rows=rows)), e.const(1.0)))
    safe = e.op("where", zero, e.const(1.0), upd)
    others = e.op("index_put", e.op("mul", g, data), idx, safe, reduction="mul")  # g * data * nonzero updates
    regular = e.op("div", take(e.op("mul", g, i)), safe)
    return [e.op("mul", g, e.op("index_put", ones, idx, upd, reduction="mul")), None,
            e.op("where", single, take(others), regular)]


row("index_put", _index_put_shape, _index_put_ref, _g_index_put, ("decompose", _d_index_put))

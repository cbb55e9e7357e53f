"""The reference interpreter: runs any Graph in numpy, in float64 or float32.

This is the oracle every kernel and rewrite is checked against.
"""
from __future__ import annotations

import numpy as np

from .graph import Graph, as_half
from .ops import OPS


def run_graph(graph: Graph, inputs: dict, dtype=np.float64, values: dict | None = None,
              keep_all: bool = False):
    """Evaluate `graph`. Returns (outputs, assigned) as name -> ndarray.

    `values` overrides graph.values (parameters and optimizer state); state leaves
    without a value start at zero. With keep_all, also returns every node's value.
    """
    values = {**graph.values, **(values or {})}
    fdt = np.dtype(dtype)
    env = [None] * len(graph.nodes)
    for i in graph.live_nodes() if not keep_all else range(len(graph.nodes)):
        n = graph.nodes[i]
        if n.op in ("input", "param", "state", "constant"):
            name = n.attr("name")
            if n.op == "input":
                if name not in inputs:
                    raise KeyError(f"missing input {name!r}")
                v = np.asarray(inputs[name])
            elif name in values:
                v = np.asarray(values[name])
            elif n.op == "state":
                v = np.zeros(n.shape)
            elif n.op == "constant":
                raise KeyError(f"no value for constant {name!r}")
            else:
                raise KeyError(f"no value for parameter {name!r}")
            if n.dtype == "f16":  # weights stored in half precision: the values the GPU reads
                v = as_half(v)
            v = v.astype(np.int32 if n.dtype == "i32" else fdt)
            if v.shape != n.shape:
                raise ValueError(f"{n.op} {name!r} has shape {v.shape}, the graph says {n.shape}")
            env[i] = v
        elif n.op == "const":
            env[i] = np.int32(n.attr("value")) if n.dtype == "i32" else fdt.type(n.attr("value"))
        else:
            out = OPS[n.op].reference([env[j] for j in n.inputs], dict(n.attrs))
            out = np.asarray(out)
            env[i] = out.astype(np.int32 if n.dtype == "i32" else fdt, copy=False)
    outs = {k: env[i] for k, i in graph.outputs.items()}
    assigned = {k: env[i] for k, i in graph.assigns.items()}
    if keep_all:
        return outs, assigned, env
    return outs, assigned

"""Weights stored in half precision: half the package bytes and GPU memory they take.

Only parameters that the GEMM-shaped kernels alone read (matmul operands, convolution
weights, through reshape views) are stored so; those kernels widen each value to f32 as
they stage it (unpack2x16float, core WGSL: no device feature needed), and all arithmetic
stays f32. Trainable parameters stay f32: an optimizer step's updates are often below half
precision's resolution around the weight. What any other kernel reads stays f32 too.

The reference interpreter rounds these weights to f16 as well, so the GPU's answers are
checked against references computed from the same stored values, at f32 tolerances.
"""
from __future__ import annotations

import numpy as np

from .ir import Graph, Node
from .schedule import base_of

# (op, input position) pairs whose kernels read a half-precision operand
READS_HALF = {("matmul", 0), ("matmul", 1), ("conv2d", 1), ("conv_transpose2d", 1)}
F16_MAX = 65504.0


def half_weights(graphs) -> set:
    """Store in f16 each parameter that every one of `graphs` (prepared graphs of one
    package, which share parameters by name) reads only through READS_HALF and never
    trains. Rewrites the graphs' parameter nodes in place; returns the names."""
    graphs = list(graphs)
    names = {name for g in graphs for name in g.leaves("param")}
    for g in graphs:
        users, live = _users_of(g), set(g.live_nodes())
        kept = {base_of(g, o) for o in list(g.outputs.values()) + list(g.assigns.values())}
        trained = set(g.assigns)
        for name, i in g.leaves("param").items():
            if name in trained or i in kept or not _only_gemm_reads(g, i, users, live):
                names.discard(name)
    for name in list(names):
        for g in graphs:
            value = g.values.get(name)
            if value is not None and np.abs(np.asarray(value)).max(initial=0.0) > F16_MAX:
                names.discard(name)  # beyond f16's range: kept f32 rather than made infinite
    for g in graphs:
        for name, i in g.leaves("param").items():
            if name in names:
                n = g.nodes[i]
                g.nodes[i] = Node(n.op, "f16", n.shape, n.inputs, n.attrs)
    return names


def _only_gemm_reads(g: Graph, i: int, users: dict, live: set) -> bool:
    """Is leaf `i` read, directly or through reshapes, by READS_HALF inputs only (and at all)?"""
    stack, found = [i], False
    while stack:
        j = stack.pop()
        for u in users.get(j, ()):
            if u not in live:
                continue
            n = g.nodes[u]
            if n.op == "reshape":
                stack.append(u)
            elif any((n.op, pos) not in READS_HALF for pos, x in enumerate(n.inputs) if x == j):
                return False
            else:
                found = True
    return found


def _users_of(g: Graph) -> dict:
    out = {}
    for u, n in enumerate(g.nodes):
        for j in n.inputs:
            out.setdefault(j, []).append(u)
    return out

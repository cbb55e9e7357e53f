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

from ..runtime.package import F16_MAX
from .ir import Node
from .schedule import base_of, readers_of

# (op, input position) pairs whose kernels read a half-precision operand
READS_HALF = {("matmul", 0), ("matmul", 1), ("conv2d", 1), ("conv_transpose2d", 1)}
# a weight whose f16 copy is this far from it (norm of the difference over the norm) stays f32:
# typical weights round to ~3e-4; values near f16's smallest normal (6.1e-5) or below round coarsely
MAX_ROUNDING = 1e-3


def half_weights(graphs) -> set:
    """Store in f16 each parameter that every one of `graphs` (prepared graphs of one
    package, which share parameters by name) reads only through READS_HALF and never
    trains. Rewrites the graphs' parameter nodes in place; returns the names."""
    graphs = list(graphs)
    names = {name for g in graphs for name in g.leaves("param")}
    for g in graphs:
        users, live = g.users(), set(g.live_nodes())
        kept = {base_of(g, o) for o in list(g.outputs.values()) + list(g.assigns.values())}
        names -= set(g.assigns)  # trained here
        names -= {name for op in ("input", "state", "constant") for name in g.leaves(op)}  # another role here
        for name, i in g.leaves("param").items():
            readers = readers_of(g, i, users, live)
            if i in kept or not readers or any((g.nodes[u].op, pos) not in READS_HALF for u, pos in readers):
                names.discard(name)
    for name in list(names):
        for g in graphs:
            value = g.values.get(name)
            if value is not None and not _rounds_well(np.asarray(value, np.float32)):
                names.discard(name)
    for g in graphs:
        for name, i in g.leaves("param").items():
            if name in names:
                n = g.nodes[i]
                g.nodes[i] = Node(n.op, "f16", n.shape, n.inputs, n.attrs)
    return names


def as_half(value) -> np.ndarray:
    """A weight as the package stores it in f16: the model's f32 value, rounded."""
    return np.asarray(value, np.float32).astype(np.float16)


def _rounds_well(w: np.ndarray) -> bool:
    """Within f16's range (65504; beyond it, infinite), and rounded by at most MAX_ROUNDING."""
    if not np.isfinite(w).all() or np.abs(w).max(initial=0.0) > F16_MAX:
        return False
    norm = float(np.linalg.norm(w.reshape(-1).astype(np.float64)))
    err = float(np.linalg.norm((as_half(w).astype(np.float64) - w).reshape(-1)))
    return err <= MAX_ROUNDING * norm

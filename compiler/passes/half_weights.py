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

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...runtime.package import F16_MAX
from ..ir.graph import Node, as_half
from .records import base_of, readers_of

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
    values = {name: next((g.values[name] for g in graphs if g.values.get(name) is not None), None)
              for name in sorted(names)}  # (no value: the package writer names the parameter)
    values = {name: v for name, v in values.items() if v is not None}
    # rounded once, on threads (numpy's casts release the GIL, and a large model's hundreds of
    # millions of values take seconds on one); the graphs then hold the values the package stores
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        halves = dict(zip(values, pool.map(_stored_half, values.values())))
    for name, half in halves.items():
        if half is None:
            names.discard(name)
            continue
        for g in graphs:
            if name in g.values:
                g.values[name] = half
    for g in graphs:
        for name, i in g.leaves("param").items():
            if name in names:
                n = g.nodes[i]
                g.nodes[i] = Node(n.op, "f16", n.shape, n.inputs, n.attrs)
    return names


def _stored_half(v):
    """`v` as stored in f16 (one halved before, by a budgeted compile, as it is), or None."""
    v = np.asarray(v)
    return as_half(v) if v.dtype == np.float16 else _close_half(np.asarray(v, np.float32))


def _close_half(w: np.ndarray):
    """`w` in f16, or None when f16 cannot hold it well: values beyond its range (65504: they
    would become infinite), or a rounding error above MAX_ROUNDING of the weight's norm."""
    if w.size == 0:
        return as_half(w)
    if not max(float(w.max()), -float(w.min())) <= F16_MAX:  # (NaN compares false: kept f32 too)
        return None
    half = as_half(w)
    flat = w.reshape(-1)
    norm2 = float(np.dot(flat, flat))
    # normal f16 values round within 2^-11 of themselves and subnormals (below 6.1e-5) within
    # 2^-25: at an RMS of 3.5e-5 or more the error is below MAX_ROUNDING of the norm for sure,
    # and the round trip back to f32 (as slow as the rounding) is skipped
    if norm2 >= (3.5e-5) ** 2 * flat.size:
        return half
    err = half.reshape(-1).astype(np.float32) - flat
    return half if float(np.dot(err, err)) <= MAX_ROUNDING ** 2 * norm2 else None

"""Optimizer rows: AdamW's updates and the NaN guard's count of non-finite gradient elements.

AdamW's moment and weight updates are elementwise ops. Written as add/mul/div nodes, they and
the NaN guard's selects would take ~21 graph nodes per parameter, most of a large training
graph and of its compile time; as rows they are three, and the scheduler still fuses them into
one kernel per parameter (one per parameter group once passes/arenas.py widens them).

Each takes the step's `ok` flag last (1: the loss and every gradient are finite) and
yields its old value where ok is 0, as a guarding `where` would: a bad batch changes nothing.
The arithmetic is that of the equivalent add/mul/div nodes, in the same order.
"""
from __future__ import annotations

import numpy as np

from .ops import EW, NOT_DIFFERENTIABLE, row


def _first_shape(nodes, at):
    shape = nodes[0].shape
    for n in nodes[1:]:  # (most are the same shape or scalars: no broadcast_shapes call per node)
        assert n.shape in (shape, ()) or np.broadcast_shapes(n.shape, shape) == shape, \
            f"{n.shape} does not broadcast to {shape}"
    assert all(n.dtype == "f32" for n in nodes), "optimizer updates take f32 tensors"
    return "f32", shape


def _moving_average_ref(xs, at):
    avg, x, ok = xs
    return np.where(ok != 0, avg * at["keep"] + x * at["take"], avg)


def _adamw_ref(xs, at):
    p, m, v, step_size, sqrt_c2, decay, ok = xs
    new = p * decay - m / (np.sqrt(v) / sqrt_c2 + at["eps"]) * step_size
    return np.where(ok != 0, new, p)


# avg * keep + x * take: AdamW's first moment (x = gradient) and second (x = its square)
row("moving_average", _first_shape, _moving_average_ref, None,
    (EW, "select({0}, {0} * {keep} + {1} * {take}, {2} != 0.0)"))
# the decoupled-decay AdamW step of parameter p from its updated moments m and v; the bias
# corrections come in as step_size = lr / (1 - beta1^t) and sqrt_c2 = sqrt(1 - beta2^t)
row("adamw_update", _first_shape, _adamw_ref, None,
    (EW, "select({0}, {0} * {5} - {1} / (sqrt({2}) / {4} + {eps}) * {3}, {6} != 0.0)"))


def _count_shape(nodes, at):
    assert nodes, "count_nonfinite takes at least one tensor"
    assert all(n.dtype == "f32" for n in nodes), "count_nonfinite takes f32 tensors"
    return "f32", ()


def _count_ref(xs, at):
    return np.array(sum(int(np.count_nonzero(~np.isfinite(x))) for x in xs), dtype=xs[0].dtype)


# how many elements of all its inputs are NaN or infinite (torch's AMP scaler checks its
# gradients the same way, several per kernel); one reduction over the inputs one after another
row("count_nonfinite", _count_shape, _count_ref, None, ("kernel", "count_nonfinite"))
NOT_DIFFERENTIABLE.update({"moving_average", "adamw_update", "count_nonfinite"})

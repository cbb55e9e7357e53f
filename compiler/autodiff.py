"""Reverse-mode autodiff on the Graph: gradients are more nodes of the same graph.

Only nodes that lie on a path from a trainable parameter to the loss get gradient
work, so frozen parameters (and everything that depends only on them) cost nothing.
"""
from __future__ import annotations

from .emit import Emitter
from .ops import NOT_DIFFERENTIABLE, OPS


def gradients(e: Emitter, loss: int, wrt: list) -> dict:
    """Adds gradient nodes of scalar `loss` with respect to node ids `wrt`.

    Returns node id -> gradient node id (only for ids in `wrt`).
    """
    g = e.g
    if g.nodes[loss].shape != ():
        raise ValueError(f"the loss must be a scalar, got shape {g.nodes[loss].shape}")
    # forward sweep: which nodes depend on something we differentiate for
    needs = [False] * (loss + 1)
    wanted = set(wrt)
    for i in range(loss + 1):
        n = g.nodes[i]
        needs[i] = i in wanted or (n.op not in NOT_DIFFERENTIABLE and any(needs[j] for j in n.inputs))
    if not needs[loss]:
        return {}
    # backward sweep, accumulating one gradient per node
    grad = {loss: e.const(1.0)}
    for i in range(loss, -1, -1):
        if i not in grad or not needs[i]:
            continue
        n = g.nodes[i]
        if not n.inputs:
            continue
        rule = OPS[n.op].gradient
        if rule is None:
            raise NotImplementedError(f"op {n.op!r} has no gradient rule")
        gi = grad[i]
        if g.nodes[gi].shape != n.shape:  # the seed constant, or a broadcast scalar
            gi = e.op("broadcast_to", gi, shape=n.shape)
        for j, gj in zip(n.inputs, rule(e, n, i, gi)):
            if gj is None or not needs[j]:
                continue
            grad[j] = gj if j not in grad else e.op("add", grad[j], gj)
    return {w: grad[w] for w in wrt if w in grad}

"""Reverse-mode autodiff on the Graph: gradients are more nodes of the same graph.

Only nodes that lie on a path from a wanted input to the output get gradient work, so
frozen parameters (and everything that depends only on them) cost nothing.
"""
from __future__ import annotations

from .ops import NOT_DIFFERENTIABLE, OPS


def gradients(e, loss: int, wrt: list) -> dict:
    """Adds gradient nodes of scalar `loss` with respect to node ids `wrt`.

    Returns node id -> gradient node id (only for ids in `wrt` that the loss depends on).
    """
    if e.g.nodes[loss].shape != ():
        raise ValueError(f"the loss must be a scalar, got shape {e.g.nodes[loss].shape}")
    return vjp(e, loss, e.const(1.0), wrt)


def vjp(e, out: int, cotangent: int, wrt: list) -> dict:
    """The vector-Jacobian product: gradients of sum(out * cotangent) w.r.t. `wrt`."""
    g = e.g
    wanted = set(wrt)
    # the nodes between `out` and the wanted ones: a decomposed op's vjp walks its own few
    # nodes, not the whole graph (which would be O(N^2) over a large training graph)
    between, stack = set(), [out]
    while stack:
        i = stack.pop()
        if i not in between:
            between.add(i)
            if i not in wanted:
                stack.extend(g.nodes[i].inputs)
    order = sorted(between)
    needs = {}
    for i in order:
        n = g.nodes[i]
        needs[i] = i in wanted or (n.op not in NOT_DIFFERENTIABLE and any(needs.get(j, False) for j in n.inputs))
    if not needs[out]:
        return {}
    grad = {out: cotangent}
    for i in reversed(order):
        if i not in grad or not needs[i] or i in wanted:
            continue  # wanted nodes are where the sweep stops: their gradient is the answer
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


def grad_via_decomposition(e, n, i: int, g: int) -> list:
    """The gradient rule of an op that lowers by decomposition: differentiate the
    decomposition itself. (The forward pieces it re-emits are merged with the forward
    pass's by common-subexpression elimination.)"""
    low = OPS[n.op].lowering  # ("decompose", fn), or a kernel that keeps one: ("kernel", name, fn)
    decompose = low[1] if low[0] == "decompose" else low[2]
    start = len(e.g.nodes)
    out = decompose(e, n)
    if out < start:  # the decomposition returned an existing node (an identity)
        return [g if j == out else None for j in n.inputs]
    # differentiate only w.r.t. the op's own inputs, through the new nodes
    grads = vjp(e, out, g, list(n.inputs))
    return [grads.get(j) for j in n.inputs]

"""Rematerialisation: a training step that fits a memory budget.

The backward pass reads forward values (a matmul's input for its weight gradient, a norm's
input, an activation's). Unbudgeted, each of them stays in memory from its forward kernel
to its last backward reader, so the step's peak holds every layer's activations at once.
Here some of them are recomputed instead: the backward reads a clone of the value's forward
subgraph, cloned back to values that are kept (or leaves) and placed, in node order, right
before the clone's first backward reader; a reader SHARE heavy backward kernels later gets
a clone of its own, so that a segment's values are not all held from its first reader to
its last. The clones are the same ops on the same inputs, so the same kernels compute the
same numbers; `after` tells the scheduler that a clone's kernel waits for the backward work
before it (it never merges into a forward kernel, which would compute it early and hold it).

Which values to recompute: a greedy choice by bytes freed per FLOP spent, cheap values first
(those whose clone holds no matmul, convolution or attention), then values whose clone holds
up to `reach` of them (segments of layers recomputed from a kept boundary). The real memory
plan (a callback: compile.py schedules and places the step) measures each candidate plan.
"""
from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, field

from ..ir.graph import LEAF_OPS, Graph, Node
from ..ir.ops import OPS
from .records import base_of

EXPENSIVE = ("matmul", "conv2d", "conv_transpose2d", "attention", "attention_lse")
HEAVY_KINDS = ("matmul", "conv", "attention")  # kernel kinds of the backward that age a clone
SHARE = 2  # heavy backward kernels a clone is shared across; a later reader makes its own
REACHES = (0, 1, 2, 3, 4, 6)  # expensive ops a clone may hold, tried in turn
CONE_NODES = 96  # nodes a clone may hold per expensive op it holds (and that many at least): a
# convolution with its training-mode batch norm and activation is some 30
SMALL = 256  # values under 1/SMALL of the largest stay kept: a statistic frees nothing, and
# its clone would recompute the reduction over its (far larger) input
UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


class BudgetError(ValueError):
    """The memory budget is under the smallest peak the step can reach."""

    def __init__(self, budget: int, reachable: int, floor: int):
        super().__init__(f"memory budget {format_bytes(budget)} is too small for the training step: the "
                         f"smallest budget it can reach is {format_bytes(reachable)} ({reachable} bytes); "
                         f"weights, gradients and optimizer state alone take {format_bytes(floor)}")
        self.budget, self.reachable, self.floor = budget, reachable, floor


@dataclass
class Remat:
    """A training graph with recomputed values, and what that costs."""
    graph: Graph
    after: dict = field(default_factory=dict)  # clone node -> the node its kernel waits for
    values: int = 0  # forward values recomputed instead of kept
    value_bytes: int = 0  # their bytes
    extra_flops: int = 0  # the clones' FLOPs
    step_flops: int = 0  # the unbudgeted step's FLOPs
    peak: int = 0  # the bytes of the step's buffers, measured
    unbudgeted: int = 0  # those bytes without recomputation

    def manifest(self, budget: int) -> dict:
        """The training section's "memory" entry (docs/PACKAGE.md)."""
        return {"budget": int(budget), "peak_bytes": int(self.peak), "unbudgeted_peak_bytes": int(self.unbudgeted),
                "rematerialised": self.values, "rematerialised_bytes": int(self.value_bytes),
                "extra_flops": int(self.extra_flops), "step_flops": int(self.step_flops)}


def parse_size(size) -> int:
    """Bytes from an int or a string like '256MiB', '1.5GB', '1GiB', '1000000'.

    Raises:
        ValueError: not a positive size.
    """
    if isinstance(size, bool):
        raise ValueError(f"not a memory size: {size!r}")
    if isinstance(size, int):
        value = size
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(size))
        unit = m and m.group(2).lower()
        if not m or unit not in UNITS:
            raise ValueError(f"not a memory size: {size!r} (use bytes, or units such as 256MiB, 1GiB, 1.5GB)")
        value = float(m.group(1)) * UNITS[unit]
        if not math.isfinite(value):
            raise ValueError(f"not a memory size: {size!r}")
        value = int(value)
    if value <= 0:
        raise ValueError(f"a memory budget must be positive, not {size!r}")
    return value


def format_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def flops(g: Graph, n: Node) -> int:
    """About how many arithmetic operations a node costs (a multiply-add is two)."""
    ins = [g.nodes[j] for j in n.inputs]
    if n.op == "matmul":
        a = ins[0].shape
        return 2 * n.size * (a[-2] if n.attr("trans_a") else a[-1])
    if n.op in ("conv2d", "conv_transpose2d"):
        w = ins[1].shape
        per = math.prod(w[1:]) if n.op == "conv2d" else w[0] * math.prod(w[2:]) // max(n.attr("groups", 1), 1)
        return 2 * n.size * per
    if n.op in ("attention", "attention_lse"):
        return 4 * ins[0].size * ins[1].shape[2]
    if n.op in LEAF_OPS or n.op == "reshape":
        return 0
    return max([n.size] + [x.size for x in ins])


def forward_of(g: Graph) -> set:
    """The forward pass: every node the loss depends on, and the updates of frozen state
    computed from those alone (batch norm's running statistics), which the backward never
    reads: recomputing their inputs would run the forward twice."""
    seen = _ancestors(g, [g.outputs["loss"]])
    frozen = [i for name, i in g.assigns.items() if name in g.frozen]
    side = _ancestors(g, frozen) - _ancestors(g, set(g.assigns.values()) - set(frozen)) - seen
    for i in sorted(side):  # (inputs first: node order is topological)
        if all(j in seen for j in g.nodes[i].inputs):
            seen.add(i)
    return seen


def _ancestors(g: Graph, ends) -> set:
    seen, stack = set(), list(ends)
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(g.nodes[i].inputs)
    return seen


def candidates(g: Graph, forward: set, inlined: set) -> dict:
    """Forward values the backward reads, directly or through values computed in their
    readers (`inlined`), and the schedule stores: node -> bytes."""
    nodes, live = g.nodes, set(g.live_nodes())
    pinned = {base_of(g, i) for i in list(g.outputs.values()) + list(g.assigns.values())}
    out, seen = {}, set()
    stack = [base_of(g, j) for i in sorted(live - forward) for j in nodes[i].inputs]
    while stack:
        b = stack.pop()
        if b in seen or b not in forward or nodes[b].op in LEAF_OPS:
            continue
        seen.add(b)
        if b in inlined:
            stack.extend(base_of(g, j) for j in nodes[b].inputs)
        elif b not in pinned:
            out[b] = nodes[b].size * 4
    return out


def cone(g: Graph, v: int, kept, forward: set) -> list:
    """The nodes a clone of `v` computes: its forward subgraph back to kept values and leaves."""
    out, stack = set(), [v]
    while stack:
        i = stack.pop()
        if i in out:
            continue
        out.add(i)
        for j in g.nodes[i].inputs:
            if j in forward and g.nodes[j].op not in LEAF_OPS and (j not in kept or g.nodes[j].op == "reshape"):
                stack.append(j)
    return sorted(out)


def ranking(g: Graph, cands: dict, forward: set, reach: int) -> list:
    """Candidates in the order a greedy choice recomputes them: most bytes per FLOP first
    (lazily re-scored: a clone only grows as fewer values are kept), each clone holding at
    most `reach` expensive ops, the clones of values chosen before it included (one that
    read it as kept would then compute its subgraph too); small values never."""
    kept = set(cands)
    cones, reads = {}, {}  # chosen value -> the nodes its clone computes, and what they read

    def fits(nodes) -> bool:
        heavy = sum(g.nodes[i].op in EXPENSIVE for i in nodes)
        return heavy <= reach and len(nodes) <= CONE_NODES * max(heavy, 1)

    def grown(v, nodes) -> list | None:
        """The chosen values whose clones read `v`, or None when one would grow too big."""
        out = [u for u in cones if v in reads[u]]
        return out if all(fits(cones[u] | nodes) for u in out) else None

    def score(v):
        nodes = set(cone(g, v, kept, forward))
        if not fits(nodes) or grown(v, nodes) is None:
            return None
        return -cands[v] / (sum(flops(g, g.nodes[i]) for i in nodes) + cands[v])

    least = max(cands.values(), default=0) // SMALL
    heap = [(s, v) for v in cands if cands[v] > least and (s := score(v)) is not None]
    heapq.heapify(heap)
    order = []
    while heap:
        s, v = heapq.heappop(heap)
        fresh = score(v)
        if fresh is None:
            continue
        if fresh > s + 1e-12:  # it got worse since: back in line
            heapq.heappush(heap, (fresh, v))
            continue
        nodes = set(cone(g, v, kept, forward))
        for u in grown(v, nodes):
            cones[u] |= nodes
            reads[u] |= _reads(g, nodes)
        cones[v], reads[v] = nodes, _reads(g, nodes)
        kept.discard(v)
        order.append(v)
    return order


def _reads(g: Graph, nodes) -> set:
    return {j for i in nodes for j in g.nodes[i].inputs}


def rematerialise(g: Graph, recompute: set, cands, forward: set) -> Remat:
    """A copy of `g` whose backward reads clones of the values in `recompute` (of `cands`,
    the values the backward reads; the others stay kept).

    Readers share a clone across SHARE matmuls, convolutions or attentions of the backward;
    a later reader computes its own (else a recomputed segment's values would all be held
    from its first reader to its last). Clones of elementwise ops over kept values cost little
    to hold and stay shared: two copies of one would read the same tensors, and the scheduler
    would merge them into one kernel."""
    out = Graph(values=dict(g.values), frozen=set(g.frozen), arenas=g.arenas, io_dtypes=dict(g.io_dtypes))
    kept = set(cands) - set(recompute)
    remap, clones, after = {}, {}, {}
    made, cheap = [], set()  # the forward node of every clone; clones of elementwise ops over kept values
    anchor = None  # the latest backward node with a kernel of its own
    heavy, born = 0, {}  # heavy backward kernels so far; clone -> that count when it was made (cheap ones aside)

    def redo(x):
        return base_of(g, x) in recompute or (x in forward and x not in kept and g.nodes[x].op not in LEAF_OPS)

    def clone(i):
        stack = [i]
        while stack:  # (iterative: a clone may reach far back)
            j = stack[-1]
            todo = [x for x in g.nodes[j].inputs if x not in clones and redo(x)]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            if j not in clones:
                n = g.nodes[j]
                ins = tuple(clones[x] if redo(x) else remap[x] for x in n.inputs)
                clones[j] = out.add(Node(n.op, n.dtype, n.shape, ins, n.attrs))
                made.append(j)
                if (n.op == "reshape" or _elementwise(n.op)) and all(x in cheap for x in n.inputs if redo(x)):
                    cheap.add(j)
                else:
                    born[j] = heavy
                if anchor is not None:
                    after[clones[j]] = anchor
        return clones[i]

    live = set(g.live_nodes())
    touches = _touching(g, recompute, kept, forward)
    for i, n in enumerate(g.nodes):
        if i in forward or i not in live or n.op == "reshape":
            remap[i] = out.add(Node(n.op, n.dtype, n.shape, tuple(remap[j] for j in n.inputs), n.attrs))
            continue
        ins = tuple(clone(j) if j in touches else remap[j] for j in n.inputs)
        remap[i] = out.add(Node(n.op, n.dtype, n.shape, ins, n.attrs))
        if n.inputs and not _elementwise(n.op):
            anchor = remap[i]
        if _heavy(n.op):
            heavy += 1
            for j in [j for j, at in born.items() if heavy - at >= SHARE]:
                clones.pop(j, None)
                del born[j]
    out.outputs = {k: remap[i] for k, i in g.outputs.items()}
    out.assigns = {k: remap[i] for k, i in g.assigns.items()}
    return Remat(out, after, len(recompute), sum(g.nodes[i].size * 4 for i in recompute),
                 sum(flops(g, g.nodes[i]) for i in made), sum(flops(g, g.nodes[i]) for i in live))


def _touching(g: Graph, recompute: set, kept: set, forward: set) -> set:
    """Forward nodes that read a recomputed value, themselves or through values that are not
    kept (those the schedule computes in their readers): the backward reads their clones."""
    out = set()
    for i in sorted(forward):  # (inputs first: node order is topological)
        n = g.nodes[i]
        if n.op in LEAF_OPS:
            continue
        if i in recompute or (i not in kept and any(j in out for j in n.inputs)):
            out.add(i)
    return out


def fit(g: Graph, budget: int, measure, inlined: set) -> Remat:
    """The step `g` with the fewest recomputed values (in greedy order) whose memory plan fits `budget`.

    Args:
        g: the prepared training graph.
        budget: bytes the step's buffers may take.
        measure: (graph, after) -> the bytes of the buffers its scheduled step takes.
        inlined: the values the unbudgeted schedule computes inside their readers (never stored).
    Raises:
        BudgetError: no plan tried fits; it names the smallest peak reached.
    """
    forward = forward_of(g)
    plain = rematerialise(g, set(), (), forward)
    plain.peak = plain.unbudgeted = least = measure(g, {})
    if least <= budget:
        return plain
    cands = candidates(g, forward, inlined)
    for reach in REACHES:
        order = ranking(g, cands, forward, reach)
        plan = rematerialise(g, set(order), cands, forward)
        plan.peak = measure(plan.graph, plan.after)
        least = min(least, plan.peak)
        if plan.peak <= budget:
            fits = _shortest(g, order, cands, forward, budget, measure, plan)
            fits.unbudgeted = plain.unbudgeted
            return fits
    raise BudgetError(budget, least, floor_bytes(g))


def _shortest(g, order, cands, forward, budget, measure, fits: Remat) -> Remat:
    """The shortest prefix of `order` that fits, by bisection (`fits`: the whole of it)."""
    lo, hi = 0, len(order)
    while hi - lo > max(1, len(order) // 64):
        mid = (lo + hi) // 2
        plan = rematerialise(g, set(order[:mid]), cands, forward)
        plan.peak = measure(plan.graph, plan.after)
        if plan.peak <= budget:
            hi, fits = mid, plan
        else:
            lo = mid
    return fits


def floor_bytes(g: Graph) -> int:
    """Parameters, optimizer state and the gradients of the trained parameters: what every
    plan keeps."""
    leaves = sum(n.size * (2 if n.dtype == "f16" else 4) for n in g.nodes if n.op in ("param", "state"))
    trained = {name for name in g.assigns if not name.startswith("optimizer.")} - set(g.frozen)
    return leaves + sum(g.nodes[i].size * 4 for name, i in g.params.items() if name in trained)


def _heavy(op: str) -> bool:
    lowering = OPS[op].lowering
    return len(lowering) > 1 and lowering[1] in HEAVY_KINDS


def _elementwise(op: str) -> bool:
    return OPS[op].lowering[0] == "elementwise"

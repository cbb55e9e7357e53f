"""The schedule's records (Kernel, Schedule) and the graph queries every pass asks:
where a view's buffer lives, who reads a value, whether a read is element for element."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..ir.graph import Graph
from ..ir.ops import OPS
from ..options import DEFAULT, CompileOptions

MAX_BINDINGS = 10  # storage buffers per kernel; every wgpu backend on desktop and mobile allows more



def is_elementwise(op: str) -> bool:
    return OPS[op].lowering[0] == "elementwise"



def flat_read(graph: Graph, user: int, pos: int) -> bool:
    """Does `user` read its input `pos` at its own flat index?"""
    n = graph.nodes[user]
    if n.op in ("transpose", "one_hot", "broadcast_to", "slice", "pad"):
        return False
    return graph.nodes[n.inputs[pos]].shape == n.shape



@dataclass
class Kernel:
    kind: str  # "elementwise" or an op's kernel template name
    roots: list  # node ids this kernel writes
    members: set = field(default_factory=set)  # all node ids computed here (elementwise)
    reads: set = field(default_factory=set)  # storage node ids read
    epilogue: set = field(default_factory=set)  # matmul: elementwise nodes computed in its store
    product: int | None = None  # matmul with an epilogue: the product node (never stored)



@dataclass
class Schedule:
    graph: Graph
    storage: dict  # node id -> node id owning its buffer (views, in-place assigns)
    kernels: list  # in execution order
    inlined: set
    views: dict = field(default_factory=dict)  # head transposes read in place by attention -> their input
    written: dict = field(default_factory=dict)  # attention outputs written in [b, t, h, d] layout -> transpose
    options: CompileOptions = DEFAULT  # what the kernel generators read their plans from
    temps: itertools.count = field(default_factory=itertools.count, repr=False, compare=False)

    def new_temp(self) -> tuple:
        """A binding key for a scratch buffer private to one kernel's dispatches."""
        return ("temp", next(self.temps))



def base_of(graph: Graph, i: int) -> int:
    while graph.nodes[i].op == "reshape":
        i = graph.nodes[i].inputs[0]
    return i



def readers_of(graph, i, users, live):
    """(user, input position) for every live user, looking through reshapes."""
    out = []
    for u in users[i]:
        if u not in live:
            continue
        if graph.nodes[u].op == "reshape":
            out.extend(readers_of(graph, u, users, live))
        else:
            out.extend((u, p) for p, j in enumerate(graph.nodes[u].inputs) if j == i)
    return out

"""The one IR: frozen nodes in topological order, and a jaxpr-style printer.

A Graph holds leaves (inputs, parameters, optimizer state, constants) and op nodes.
Node ids are positions in `graph.nodes`; inputs always point backwards, so the list
is a valid evaluation order. `assigns` maps a parameter or state name to the node
whose value replaces it after the program ran (how a training step updates weights).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

LEAF_OPS = ("input", "param", "state", "constant", "const")
NAMED_LEAVES = ("input", "param", "state", "constant")  # leaves that own a buffer
DTYPES = ("f32", "i32", "f16")  # f16: stored weights only (passes/half_weights.py)


@dataclass(frozen=True)
class Node:
    op: str
    dtype: str
    shape: tuple
    inputs: tuple = ()
    attrs: tuple = ()  # sorted (key, value) pairs; values hashable

    def attr(self, key, default=None):
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # (not np.prod: a large compile asks hundreds of thousands of times)


def make_attrs(**kw) -> tuple:
    return tuple(sorted((k, _freeze(v)) for k, v in kw.items() if v is not None))


def _freeze(v):
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.generic):
        return v.item()
    return v


@dataclass
class Graph:
    nodes: list = field(default_factory=list)
    outputs: dict = field(default_factory=dict)  # name -> node id
    assigns: dict = field(default_factory=dict)  # param/state name -> node id
    values: dict = field(default_factory=dict)  # param/state/const-tensor name -> ndarray
    frozen: set = field(default_factory=set)  # parameter names that get no gradient
    # trainable parameter names in groups laid out one after another in shared buffers
    # (passes/arenas.py): the optimizer updates each group in one kernel
    arenas: tuple = ()
    # ("input" | "output", name) -> the source model's element type where the GPU's differs
    # (float16, bfloat16, int64, uint8, bool, ...): the package records it, and a Session
    # converts at the boundary (an f32 output recorded float16 comes back as float16)
    io_dtypes: dict = field(default_factory=dict)
    named: dict = field(default_factory=dict, repr=False)  # (leaf op, name) -> id, kept by add()
    # leaf op -> {name: id}, kept by add(): leaves() is called per parameter in places, and a
    # scan of all nodes each time would be quadratic in the graph's size
    by_op: dict = field(default_factory=dict, repr=False)

    def add(self, node: Node) -> int:
        for i in node.inputs:
            if not 0 <= i < len(self.nodes):
                raise ValueError(f"node {node.op} refers to missing node {i}")
        self.nodes.append(node)
        if node.op in NAMED_LEAVES:
            i, name = len(self.nodes) - 1, node.attr("name")
            self.named.setdefault((node.op, name), i)
            self.by_op.setdefault(node.op, {})[name] = i
        return len(self.nodes) - 1

    def copy(self) -> Graph:
        """A graph that can grow apart from this one: its containers copied, its frozen nodes
        and weight arrays shared (never written in place; copying them takes seconds for a large model)."""
        return Graph(nodes=list(self.nodes), outputs=dict(self.outputs), assigns=dict(self.assigns),
                     values=dict(self.values), frozen=set(self.frozen), named=dict(self.named), arenas=self.arenas,
                     io_dtypes=dict(self.io_dtypes),
                     by_op={op: dict(v) for op, v in self.by_op.items()})

    def leaves(self, op: str) -> dict:
        """name -> node id for every leaf of one kind ('input', 'param', 'state')."""
        return dict(self.by_op.get(op, {}))

    @property
    def inputs(self) -> dict:
        return self.leaves("input")

    @property
    def params(self) -> dict:
        return self.leaves("param")

    def users(self) -> list:
        out = [[] for _ in self.nodes]
        for i, n in enumerate(self.nodes):
            for j in n.inputs:
                out[j].append(i)
        return out

    def live_nodes(self) -> list:
        """Ids reachable from outputs and assigns, in order."""
        keep = set()
        stack = list(self.outputs.values()) + list(self.assigns.values())
        while stack:
            i = stack.pop()
            if i in keep:
                continue
            keep.add(i)
            stack.extend(self.nodes[i].inputs)
        return sorted(keep)

    def __str__(self) -> str:
        return format_graph(self)


def _fmt_attr(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v)


def format_graph(g: Graph) -> str:
    """Readable text, one line per node, in the style of a jaxpr."""
    lines = []
    for i, n in enumerate(g.nodes):
        ty = f"{n.dtype}[{','.join(str(d) for d in n.shape)}]"
        args = " ".join(f"%{j}" for j in n.inputs)
        attrs = " ".join(f"{k}={_fmt_attr(v)}" for k, v in n.attrs)
        body = " ".join(s for s in (n.op, args, attrs) if s)
        lines.append(f"%{i}:{ty} = {body}")
    for name, i in g.outputs.items():
        lines.append(f"output {name} = %{i}")
    for name, i in g.assigns.items():
        lines.append(f"assign {name} <- %{i}")
    return "\n".join(lines)


def as_half(value) -> np.ndarray:
    """A weight as the package stores it in f16: the model's f32 value, rounded, C-ordered
    (an importer's transposed view too)."""
    v = np.asarray(value)
    if v.dtype == np.float16 and v.flags.c_contiguous:
        return v
    return np.ascontiguousarray(np.asarray(v, np.float32), dtype=np.float16)

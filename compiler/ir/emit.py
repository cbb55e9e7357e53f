"""Adds op nodes to a Graph with their shapes inferred by the op table.

Everything that writes nodes (the builder, autodiff, optimizers, ONNX import) goes
through `Emitter.op`, so a shape error is raised where the node is made.
"""
from __future__ import annotations

import numpy as np

from .graph import Graph, Node, make_attrs
from .ops import OPS


class ShapeError(ValueError):
    pass


class Emitter:
    def __init__(self, graph: Graph):
        self.g = graph
        self._consts = {}

    def node(self, i: int) -> Node:
        return self.g.nodes[i]

    def shape(self, i: int) -> tuple:
        return self.g.nodes[i].shape

    def op(self, op: str, *inputs: int, **attrs) -> int:
        row = OPS.get(op)
        if row is None:
            raise KeyError(f"unknown op {op!r}")
        nodes = [self.g.nodes[i] for i in inputs]
        at = make_attrs(**attrs)
        try:
            dtype, shape = row.shape_rule(nodes, dict(at))
        except ShapeError:
            raise
        except Exception as exc:  # a shape rule's own assertion, reworded
            shapes = ", ".join(str(n.shape) for n in nodes)
            raise ShapeError(f"{op}: inputs with shapes {shapes} and {dict(at)}: {exc}") from None
        return self.g.add(Node(op, dtype, tuple(int(d) for d in shape), tuple(inputs), at))

    def leaf(self, op: str, name: str, shape, dtype="f32", value=None) -> int:
        if (op, name) in self.g.named:
            raise ValueError(f"{op} {name!r} declared twice")
        if value is not None:
            self.g.values[name] = np.asarray(value)
        return self.g.add(Node(op, dtype, tuple(int(d) for d in shape), (), make_attrs(name=name)))

    def constant(self, value, name: str | None = None, dtype: str = "f32") -> int:
        """A constant tensor (interpolation matrices, masks, RoPE tables), stored in the
        package like a frozen weight but never saved as one. Shared by content."""
        import hashlib

        value = np.ascontiguousarray(value, dtype=np.int32 if dtype == "i32" else np.float64)  # float64 for the oracle
        key = hashlib.sha1(value.tobytes() + str(value.shape).encode()).hexdigest()[:16]
        if name is None:
            name = f"constant.{dtype}.{key}"
        existing = self.g.named.get(("constant", name))
        if existing is not None:
            return existing
        return self.leaf("constant", name, value.shape, dtype, value)

    def const(self, value: float, dtype: str = "f32") -> int:
        """A scalar constant, shared by value: f32, or i32 (an integer that fits 32 bits)."""
        if dtype == "i32":
            if value != int(value) or not -(1 << 31) <= int(value) < (1 << 31):
                raise ValueError(f"i32 constant {value!r} is not a 32-bit integer")
            value = int(value)
        else:
            value = float(value)
        key = value if dtype == "f32" else (value, dtype)
        if key not in self._consts:
            self._consts[key] = self.g.add(Node("const", dtype, (), (), make_attrs(value=value)))
        return self._consts[key]

    # small conveniences used by gradient rules and optimizers
    def reshape(self, x: int, shape) -> int:
        shape = tuple(int(d) for d in shape)
        return x if self.shape(x) == shape else self.op("reshape", x, shape=shape)

    def sum_to(self, x: int, shape) -> int:
        """Sum a broadcast result back to `shape` (numpy broadcasting rules)."""
        shape = tuple(shape)
        xs = self.shape(x)
        if xs == shape:
            return x
        lead = len(xs) - len(shape)
        padded = (1,) * lead + shape
        axes = tuple(a for a in range(len(xs)) if padded[a] == 1 and xs[a] != 1)
        if axes:
            x = self.op("reduce_sum", x, axes=axes, keepdims=True)
        return self.reshape(x, shape)

    def scale(self, x: int, factor: float) -> int:
        return x if factor == 1.0 else self.op("mul", x, self.const(factor))

"""The Python builder API: build a model op by op, PyTorch-style names for weights.

    b = Builder()
    x = b.input("x", (64, 64))
    h = b.relu(b.linear(x, b.param("fc1.weight", w1), b.param("fc1.bias", b1)))
    b.output("logits", b.linear(h, b.param("fc2.weight", w2), b.param("fc2.bias", b2)))
    model = b.build()
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .emit import Emitter
from .graph import Graph
from .ops import OPS


class Tensor:
    """A handle on one node of the graph being built, with arithmetic operators."""

    def __init__(self, builder: "Builder", node: int):
        self.b, self.id = builder, node

    @property
    def shape(self) -> tuple:
        return self.b.g.nodes[self.id].shape

    @property
    def dtype(self) -> str:
        return self.b.g.nodes[self.id].dtype

    def _bin(self, op, other, swap=False):
        other = self.b.lift(other, self.dtype)
        a, c = (other, self) if swap else (self, other)
        return self.b.op(op, a, c)

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, True)
    def __neg__(self): return self.b.op("neg", self)
    def __matmul__(self, o): return self.b.matmul(self, o)
    def __pow__(self, c): return self.b.pow(self, c)

    def __repr__(self):
        return f"Tensor(%{self.id}: {self.dtype}{list(self.shape)})"


@dataclass(frozen=True)
class InitializerNote:
    """What an importer did with a weight that several nodes read: "split" it into one
    parameter per tensor the source model kept apart (an exporter merged equal values), or
    kept it "tied" (one parameter, as the source model uses it)."""
    action: str  # "split" | "tied"
    initializer: str  # the source file's name for it
    params: tuple  # the parameters it became
    why: str


class Model:
    """A built forward graph: inputs, parameters with values, named outputs."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.initializer_notes: tuple = ()  # InitializerNote records of an import

    @property
    def params(self) -> dict:
        return {k: self.graph.values[k] for k in self.graph.params}

    def __str__(self):
        return str(self.graph)


class Builder:
    """Builds a Model op by op, with PyTorch-style names for its weights.

    Every row of the op table is a method too (`b.relu(x)`, `b.conv2d(x, w, ...)`: see
    compiler/ir/ops.py); Tensors take `+ - * / @ **` with Tensors and scalars.

        b = Builder()
        x = b.input("x", (64, 784))
        h = b.relu(b.linear(x, b.param("fc1.weight", w1), b.param("fc1.bias", b1)))
        b.output("logits", b.linear(h, b.param("fc2.weight", w2), b.param("fc2.bias", b2)))
        model = b.build()
    """

    def __init__(self):
        self.g = Graph()
        self.e = Emitter(self.g)

    @classmethod
    def extend(cls, model: "Model") -> "Builder":
        """Keep building on an existing model's graph (e.g. a head on a backbone); the
        model's outputs are available as `b.outputs[name]`."""
        b = cls()
        b.g = model.graph
        b.e = Emitter(b.g)
        return b

    @property
    def outputs(self) -> dict:
        return {k: Tensor(self, i) for k, i in self.g.outputs.items()}

    def state(self, name: str, shape) -> Tensor:
        """A persistent tensor (zeros at load) that programs write with `assign` and read."""
        existing = self.g.named.get(("state", name))
        if existing is not None:
            return Tensor(self, existing)
        return Tensor(self, self.e.leaf("state", name, shape))

    def assign(self, name: str, value: Tensor) -> None:
        """After the program runs, state or parameter `name` holds `value`."""
        self.g.assigns[name] = value.id

    # leaves
    def input(self, name: str, shape, dtype: str = "f32") -> Tensor:
        """An input the caller gives each run, of fixed `shape` and `dtype` ("f32" or "i32")."""
        return Tensor(self, self.e.leaf("input", name, shape, dtype))

    def param(self, name: str, value, frozen: bool = False) -> Tensor:
        """A parameter named `name` (saved and loaded by that name) holding `value` (f32);
        `frozen`: never trained."""
        value = np.asarray(value, dtype=np.float32)
        if frozen:
            self.g.frozen.add(name)
        return Tensor(self, self.e.leaf("param", name, value.shape, "f32", value))

    def constant(self, value) -> Tensor:
        """A constant tensor: part of the model, never trained nor saved as a weight."""
        return Tensor(self, self.e.constant(value))

    def constant_ids(self, value) -> Tensor:
        """A constant tensor of integer ids (indices for gather, class ids)."""
        return Tensor(self, self.e.constant(value, dtype="i32"))

    def const(self, value: float, dtype: str = "f32") -> Tensor:
        return Tensor(self, self.e.const(value, dtype))

    def lift(self, x, dtype: str = "f32") -> Tensor:
        """A Tensor as it is; a scalar as a constant (of `dtype` when it is an integer's)."""
        if isinstance(x, Tensor):
            return x
        if np.ndim(x) == 0:
            whole = dtype == "i32" and float(x) == int(x)
            return self.const(int(x), "i32") if whole else self.const(float(x))
        raise TypeError("only scalars mix with tensors; wrap arrays with Builder.param(..., frozen=True)")

    def output(self, name: str, t: Tensor) -> Tensor:
        """Make `t` the model's output `name`; returns `t`."""
        self.g.outputs[name] = t.id
        return t

    def build(self) -> Model:
        """The Model built so far, for compile_model (ValueError when it has no output)."""
        if not self.g.outputs:
            raise ValueError("the model has no outputs: call Builder.output(name, tensor)")
        return Model(self.g)

    # any row of the op table
    def op(self, name: str, *inputs, **attrs) -> Tensor:
        # a scalar beside an integer tensor is an integer constant (when it is whole)
        dtype = "i32" if any(isinstance(t, Tensor) and t.dtype == "i32" for t in inputs) else "f32"
        ids = [self.lift(t, dtype).id for t in inputs]
        return Tensor(self, self.e.op(name, *ids, **attrs))

    def __getattr__(self, name):
        if name in OPS and OPS[name].lowering[0] != "leaf":
            return lambda *xs, **at: self.op(name, *xs, **at)
        raise AttributeError(name)

    # conveniences with PyTorch's names and argument conventions
    def matmul(self, a, b, trans_a=False, trans_b=False) -> Tensor:
        a, b = self.lift(a), self.lift(b)
        squeeze = len(b.shape) == 1
        if squeeze:
            b = self.reshape(b, b.shape + (1,))
        if len(a.shape) == 1:
            a = self.reshape(a, (1,) + a.shape)
            out = self.op("matmul", a, b, trans_a=trans_a, trans_b=trans_b)
            out = self.reshape(out, out.shape[:-2] + out.shape[-1:])
        else:
            out = self.op("matmul", a, b, trans_a=trans_a, trans_b=trans_b)
        return self.reshape(out, out.shape[:-1]) if squeeze else out

    def linear(self, x, weight, bias=None) -> Tensor:
        """x @ weight.T + bias, weight in PyTorch's [out, in] layout."""
        y = self.matmul(x, weight, trans_b=True)
        return y + bias if bias is not None else y

    def reshape(self, x, shape) -> Tensor:
        x = self.lift(x)
        shape = list(shape)
        if -1 in shape:
            known = int(np.prod([d for d in shape if d != -1]))
            shape[shape.index(-1)] = x.b.g.nodes[x.id].size // max(known, 1)
        return Tensor(self, self.e.reshape(x.id, shape))

    def transpose(self, x, perm=None) -> Tensor:
        x = self.lift(x)
        perm = tuple(reversed(range(len(x.shape)))) if perm is None else tuple(p % len(x.shape) for p in perm)
        return x if perm == tuple(range(len(perm))) else self.op("transpose", x, perm=perm)

    def sum(self, x, axes=None, keepdims=False) -> Tensor:
        x = self.lift(x)
        axes = tuple(range(len(x.shape))) if axes is None else _tuple(axes)
        return self.op("reduce_sum", x, axes=axes, keepdims=keepdims)

    def max(self, x, axes=None, keepdims=False) -> Tensor:
        x = self.lift(x)
        axes = tuple(range(len(x.shape))) if axes is None else _tuple(axes)
        return self.op("reduce_max", x, axes=axes, keepdims=keepdims)

    def mean(self, x, axes=None, keepdims=False) -> Tensor:
        x = self.lift(x)
        axes = tuple(range(len(x.shape))) if axes is None else _tuple(axes)
        count = int(np.prod([x.shape[a] for a in axes]))
        return self.sum(x, axes, keepdims) * (1.0 / max(count, 1))

    def _last_axis(self, name, x, axis):
        x = self.lift(x)
        axis = axis % len(x.shape)
        last = len(x.shape) - 1
        if axis == last:
            return self.op(name, x)
        perm = list(range(len(x.shape)))
        perm[axis], perm[last] = last, axis
        return self.transpose(self.op(name, self.transpose(x, perm)), perm)

    def softmax(self, x, axis=-1) -> Tensor:
        return self._last_axis("softmax", x, axis)

    def log_softmax(self, x, axis=-1) -> Tensor:
        return self._last_axis("log_softmax", x, axis)

    def gelu(self, x, approximate="none") -> Tensor:
        return self.op("gelu", x, approximate=approximate)

    def pow(self, x, exponent: float) -> Tensor:
        return self.op("pow", x, exponent=float(exponent))

    def argmax(self, x, axis: int = -1, keepdims: bool = False, last: bool = False) -> Tensor:
        """The index (i32) of the greatest element along `axis`; ties: the first (`last`: the last)."""
        return self.op("argmax", x, axis=axis, keepdims=keepdims, last=last)

    def argmin(self, x, axis: int = -1, keepdims: bool = False, last: bool = False) -> Tensor:
        return self.op("argmax", x, axis=axis, keepdims=keepdims, last=last, smallest=True)

    def topk(self, x, k: int, axis: int = -1, largest: bool = True) -> tuple:
        """(values, i32 indices) of the k greatest (or least) elements along `axis`, best
        first, ties by lower index."""
        at = {"k": int(k), "axis": axis, "smallest": not largest}
        return self.op("topk", x, **at), self.op("topk_indices", x, **at)

    def cross_entropy(self, logits, labels, mask=None) -> Tensor:
        ins = [logits, labels] + ([mask] if mask is not None else [])
        return self.op("cross_entropy", *ins)

    def mse(self, pred, target, mask=None) -> Tensor:
        ins = [pred, target] + ([mask] if mask is not None else [])
        return self.op("mse", *ins)


def _tuple(axes):
    return (axes,) if isinstance(axes, int) else tuple(axes)

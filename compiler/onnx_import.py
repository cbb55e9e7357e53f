"""ONNX -> Model: the ops that torch.onnx.export writes (opsets 13-21, both exporters).

    model = load_onnx("mlp.onnx", batch_size=64)

Every ONNX value is either a graph Tensor (made with the Builder) or a known numpy
array (`_Known`). Shape arithmetic (Shape, Gather, Concat, Unsqueeze, ...) whose inputs
are all known is folded here with numpy, so the Graph only holds tensor math.

Weights: float initializers become `Builder.param` named as the initializer, so that
`save_weights` writes the source model's names. The dynamo exporter marks which
initializers are PyTorch parameters (trainable) and buffers (frozen params); its other
initializers are exporter constants, folded like Constant nodes. A known float array
that must become a tensor is a scalar `Builder.const` when it has one element, else a
frozen param (`const.<output name>` for Constant nodes).

Both exporters fold `W.T` of a Linear applied to a 3-D input into a new initializer.
The dynamo exporter records where it came from: W is imported under its PyTorch name
and the MatMul becomes matmul(trans_b). The TorchScript exporter does not: its
`onnx::MatMul_N` stays a trainable weight under that name unless the model is exported
with `do_constant_folding=False`, which keeps Transpose(W) (imported as trans_b too).
"""
from __future__ import annotations

import ast
import math
import os
from dataclasses import dataclass

import numpy as np

from .builder import Builder, Model, Tensor

_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
_FOLDED = "pkg.onnxscript.optimizer.folded_from"
_FLOAT = frozenset({1, 10, 11, 16})  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
_INT = frozenset({2, 3, 4, 5, 6, 7, 9, 12, 13})  # (U)INT8-64, BOOL


@dataclass
class _Known:
    """A value known at import time. kind: "const" (foldable), "param", "buffer"."""
    value: np.ndarray
    name: str
    kind: str = "const"
    transposed: bool = False  # the ONNX value is value.T (a folded W.T)
    tensor: Tensor | None = None  # made on first use as a graph tensor


def load_onnx(source, batch_size: int | None = None) -> Model:
    """Import an ONNX model (a path, bytes, or an onnx.ModelProto) into a Model.

    A dynamic first dimension of a graph input becomes `batch_size` (default 64).
    """
    import onnx

    if isinstance(source, (bytes, bytearray)):
        proto = onnx.load_from_string(bytes(source))
    elif isinstance(source, (str, os.PathLike)):
        proto = onnx.load(os.fspath(source))
    else:
        proto = source
    if len(proto.functions):
        from onnx import inliner
        proto = inliner.inline_local_functions(proto)
    return _Importer(proto, 64 if batch_size is None else int(batch_size)).run()


class _Importer:
    def __init__(self, proto, batch_size):
        from onnx import numpy_helper

        self.proto, self.batch = proto, batch_size
        self.opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 21)
        self.b = Builder()
        self.env = {"": None}
        self.label = ""
        g = proto.graph
        self.inits = {i.name for i in g.initializer}
        meta = {vi.name: {p.key: p.value for p in vi.metadata_props} for vi in list(g.value_info) + list(g.input)}
        kinds = {name: m[_KIND] for name, m in meta.items() if _KIND in m}
        linear = _folded_linear_weights(g, meta) if kinds else {}
        for init in g.initializer:
            value = numpy_helper.to_array(init)
            if init.name in linear:  # W.T folded out of aten.linear: import W under its own name
                self.env[init.name] = _Known(value.T, linear[init.name], "param", transposed=True)
                continue
            if init.data_type not in _FLOAT:
                kind = "const"
            elif not kinds:  # no torch.export signature (the TorchScript exporter): all weights
                kind = "param"
            else:  # an initializer folded out of weights stays a weight
                sources = [kinds.get(n) for n in _names(meta.get(init.name, {}).get(_FOLDED, "[]"))]
                origin = [kinds.get(init.name)] + sources
                kind = "param" if "PARAMETER" in origin else "buffer" if "BUFFER" in origin else "const"
            self.env[init.name] = _Known(value, init.name, kind)

    # ------------------------------------------------------------------ driver
    def run(self) -> Model:
        g = self.proto.graph
        for vi in g.input:
            if vi.name not in self.env:
                self.env[vi.name] = self._input(vi)
        for node in g.node:
            self._node(node)
        for vi in g.output:
            self.b.output(vi.name, self.tensor(vi.name))
        return self.b.build()

    def _input(self, vi):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            raise ValueError(f"graph input {vi.name!r} has no tensor shape")
        if tt.elem_type in _FLOAT:
            dtype = "f32"
        elif tt.elem_type in _INT:
            dtype = "i32"
        else:
            raise NotImplementedError(f"graph input {vi.name!r} has ONNX element type {tt.elem_type}")
        shape = []
        for axis, d in enumerate(tt.shape.dim):
            static = d.HasField("dim_value") and d.dim_value > 0
            if static:
                shape.append(d.dim_value)
            elif axis == 0:
                shape.append(self.batch)
            else:
                what = d.dim_param or d.dim_value or "unknown"
                raise ValueError(f"graph input {vi.name!r}: dimension {axis} is dynamic ({what}); "
                                 "only the first (batch) dimension may be dynamic")
        return self.b.input(vi.name, tuple(shape), dtype)

    def _node(self, node):
        op, label = node.op_type, node.name or (node.output[0] if node.output else "?")
        self.label = label
        if node.domain not in ("", "ai.onnx"):
            raise NotImplementedError(f"ONNX op {node.domain}::{op} (node {label!r}) is not supported; "
                                      f"supported ops: {', '.join(supported_ops())}")
        for name in node.input:
            if name not in self.env:
                raise ValueError(f"node {label!r} ({op}) reads {name!r}, which nothing produced before it")
        at = _attrs(node)
        ins = [self.env[n] for n in node.input]
        foldable = all(v is None or (isinstance(v, _Known) and v.kind == "const") for v in ins)
        if op in ("Shape", "Size"):
            s = self.known(node.input[0]).shape if isinstance(ins[0], _Known) else ins[0].shape
            if op == "Size":
                outs = [np.array(int(np.prod(s)), np.int64)]
            else:
                outs = [np.array(s, np.int64)[slice(at.get("start", 0), at.get("end"))]]
        elif foldable and op in _FOLD:
            vals = [None if v is None else v.value for v in ins]
            try:
                outs = _FOLD[op](self, vals, at)
            except NotImplementedError:
                raise
            except Exception as exc:
                raise ValueError(f"folding node {label!r} ({op}) failed: {exc}") from exc
        elif op in _BUILD:
            outs = _BUILD[op](self, list(node.input), at)
        else:
            if op in _FOLD:
                raise NotImplementedError(f"ONNX op {op} (node {label!r}) is supported only on "
                                          "inputs known at import time (shape arithmetic)")
            raise NotImplementedError(f"ONNX op {op} (node {label!r}) is not supported; "
                                      f"supported ops: {', '.join(supported_ops())}")
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        for name, v in zip(node.output, outs):
            if name:
                self.env[name] = v if isinstance(v, (Tensor, _Known)) else _Known(np.asarray(v), name)

    # ------------------------------------------------------------------ values
    def tensor(self, name) -> Tensor:
        """The graph tensor of an ONNX value, making a param or const for a known one."""
        v = self.env[name]
        if isinstance(v, Tensor):
            return v
        if v.tensor is None:
            arr = v.value
            if v.kind == "const" and arr.dtype.kind not in "fc":
                raise NotImplementedError(f"integer constant {name!r} {list(arr.shape)} is used as a "
                                          "tensor; only float tensors are computed")
            if v.kind == "const" and arr.ndim == 0:
                v.tensor = self.b.const(float(arr))
            else:
                pname = v.name if v.kind != "const" or v.name in self.inits else f"const.{v.name}"
                v.tensor = self.b.param(pname, arr.astype(np.float32), frozen=v.kind != "param")
                if v.transposed:  # MatMul turns this into trans_b
                    v.tensor = self.b.transpose(v.tensor, (1, 0))
        return v.tensor

    def known(self, name, what="this input"):
        """The numpy value of an input that must be known at import time."""
        v = self.env.get(name)
        if not isinstance(v, _Known):
            raise NotImplementedError(f"node {self.label!r}: {what} ({name!r}) must be a constant")
        return v.value.T if v.transposed else v.value

    def operand(self, name, other: Tensor | None) -> Tensor:
        """A binary op's operand: a one-element constant becomes a scalar const."""
        v = self.env[name]
        if _is_scalar(v) and other is not None and v.value.ndim <= len(other.shape):
            return self.b.const(float(v.value.reshape(())))
        return self.tensor(name)

    def pair(self, a, c):
        """Both operands of a binary op; a one-element constant side becomes a scalar."""
        if _is_scalar(self.env[a]) and not _is_scalar(self.env[c]):
            tc = self.tensor(c)
            return self.operand(a, tc), tc
        ta = self.tensor(a)
        return ta, self.operand(c, ta)

    def axes(self, ins, at, rank):
        """Reduce/Squeeze/Unsqueeze axes: attribute (older opsets) or second input."""
        if "axes" in at:
            axes = at["axes"]
        elif len(ins) > 1 and ins[1]:
            axes = self.known(ins[1], "axes")
        else:
            return None
        axes = [int(a) for a in np.asarray(axes).reshape(-1)]
        return [a % rank if rank else a for a in axes] if axes else None


def _folded_linear_weights(g, meta) -> dict:
    """Initializers that torch's dynamo exporter folded from W.T of an aten.linear
    (x of rank 3 or more): initializer name -> the PyTorch parameter name of W."""
    out = {}
    for node in g.node:
        if node.op_type != "MatMul" or len(node.input) != 2:
            continue
        fx = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.fx_node"), "")
        src = _names(meta.get(node.input[1], {}).get(_FOLDED, "[]"))
        if ("aten.linear" in fx and len(src) == 1 and src[0] not in meta
                and f"%p_{src[0].replace('.', '_')}" in fx):
            out[node.input[1]] = src[0]
    return out


def _names(text):
    try:
        names = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return [str(n) for n in names] if isinstance(names, (list, tuple, set)) else []


def _is_scalar(v):
    return isinstance(v, _Known) and v.kind == "const" and v.value.size == 1 and v.value.dtype.kind == "f"


def _attrs(node) -> dict:
    from onnx import helper, numpy_helper

    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif hasattr(v, "data_type") and hasattr(v, "dims"):
            v = numpy_helper.to_array(v)
        out[a.name] = v
    return out


def _np_dtype(onnx_type):
    from onnx import helper
    return helper.tensor_dtype_to_np_dtype(onnx_type)


def _reshape_target(in_shape, shape, allowzero=0):
    shape = [int(d) for d in np.asarray(shape).reshape(-1)]
    out = [in_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = int(np.prod(in_shape)) // max(known, 1)
    return tuple(out)


def _unsqueeze_shape(shape, axes):
    rank = len(shape) + len(axes)
    out = list(shape)
    for a in sorted(a % rank for a in axes):
        out.insert(a, 1)
    return tuple(out)


def _squeeze_shape(shape, axes):
    if axes is None:
        return tuple(d for d in shape if d != 1)
    axes = {a % len(shape) for a in axes}
    for a in axes:
        if shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of shape {shape}")
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _flatten_shape(shape, axis):
    axis = axis % len(shape) if axis < 0 else axis
    return (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))


# ------------------------------------------------- folding (all inputs known)
def _int_div(a, c):
    if a.dtype.kind in "iub" and c.dtype.kind in "iub":
        return (np.sign(a) * np.sign(c) * (np.abs(a) // np.abs(c))).astype(np.result_type(a, c))
    return a / c


def _fold_slice(im, xs, at):
    x = xs[0]
    if len(xs) > 1:
        starts, ends = xs[1], xs[2]
        axes = xs[3] if len(xs) > 3 and xs[3] is not None else range(len(starts))
        steps = xs[4] if len(xs) > 4 and xs[4] is not None else [1] * len(starts)
    else:
        starts, ends = at["starts"], at["ends"]
        axes, steps = at.get("axes", range(len(starts))), [1] * len(starts)
    idx = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        idx[int(a) % x.ndim] = slice(int(s), int(e), int(st))
    return x[tuple(idx)]


def _fold_reduce(fn):
    def fold(im, xs, at):
        axes = at.get("axes", xs[1] if len(xs) > 1 and xs[1] is not None and xs[1].size else None)
        if axes is None and at.get("noop_with_empty_axes", 0):
            return xs[0]
        axes = None if axes is None else tuple(int(a) for a in np.asarray(axes).reshape(-1))
        return fn(xs[0], axis=axes, keepdims=bool(at.get("keepdims", 1)))
    return fold


def _fold_axes(xs, at):
    axes = at.get("axes", xs[1] if len(xs) > 1 and xs[1] is not None else None)
    return None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]


def _variadic(fn):
    def fold(im, xs, at):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out
    return fold


def _cof(im, xs, at):
    fill = at.get("value", np.zeros(1, np.float32))
    return np.full(tuple(int(d) for d in xs[0]), fill.reshape(-1)[0], fill.dtype)


_erf = np.vectorize(math.erf, otypes=[np.float64])

_FOLD = {
    "Constant": lambda im, xs, at: _constant(at),
    "Identity": lambda im, xs, at: xs[0],
    "Dropout": lambda im, xs, at: xs[0],
    "Cast": lambda im, xs, at: xs[0].astype(_np_dtype(at["to"])),
    "Reshape": lambda im, xs, at: xs[0].reshape(_reshape_target(xs[0].shape, xs[1], at.get("allowzero", 0))),
    "Flatten": lambda im, xs, at: xs[0].reshape(_flatten_shape(xs[0].shape, at.get("axis", 1))),
    "Transpose": lambda im, xs, at: np.transpose(xs[0], at.get("perm")),
    "Unsqueeze": lambda im, xs, at: xs[0].reshape(_unsqueeze_shape(xs[0].shape, _fold_axes(xs, at))),
    "Squeeze": lambda im, xs, at: xs[0].reshape(_squeeze_shape(xs[0].shape, _fold_axes(xs, at))),
    "Gather": lambda im, xs, at: np.take(xs[0], xs[1].astype(np.int64), axis=at.get("axis", 0)),
    "Concat": lambda im, xs, at: np.concatenate([x for x in xs if x is not None], axis=at["axis"]),
    "Slice": _fold_slice,
    "ConstantOfShape": _cof,
    "Range": lambda im, xs, at: np.arange(xs[0], xs[1], xs[2]).astype(xs[0].dtype),
    "Expand": lambda im, xs, at: np.broadcast_to(
        xs[0], np.broadcast_shapes(xs[0].shape, tuple(int(d) for d in xs[1]))).copy(),
    "Where": lambda im, xs, at: np.where(xs[0], xs[1], xs[2]),
    "Equal": lambda im, xs, at: np.equal(xs[0], xs[1]),
    "Less": lambda im, xs, at: np.less(xs[0], xs[1]),
    "Greater": lambda im, xs, at: np.greater(xs[0], xs[1]),
    "Not": lambda im, xs, at: np.logical_not(xs[0]),
    "And": lambda im, xs, at: np.logical_and(xs[0], xs[1]),
    "Or": lambda im, xs, at: np.logical_or(xs[0], xs[1]),
    "Add": lambda im, xs, at: xs[0] + xs[1],
    "Sub": lambda im, xs, at: xs[0] - xs[1],
    "Mul": lambda im, xs, at: xs[0] * xs[1],
    "Div": lambda im, xs, at: _int_div(xs[0], xs[1]),
    "Mod": lambda im, xs, at: np.fmod(xs[0], xs[1]) if at.get("fmod") else np.mod(xs[0], xs[1]),
    "Pow": lambda im, xs, at: np.power(xs[0], xs[1]).astype(xs[0].dtype),
    "Neg": lambda im, xs, at: -xs[0],
    "Abs": lambda im, xs, at: np.abs(xs[0]),
    "Floor": lambda im, xs, at: np.floor(xs[0]),
    "Ceil": lambda im, xs, at: np.ceil(xs[0]),
    "Sqrt": lambda im, xs, at: np.sqrt(xs[0]),
    "Exp": lambda im, xs, at: np.exp(xs[0]),
    "Log": lambda im, xs, at: np.log(xs[0]),
    "Relu": lambda im, xs, at: np.maximum(xs[0], 0),
    "Sigmoid": lambda im, xs, at: 1 / (1 + np.exp(-xs[0])),
    "Tanh": lambda im, xs, at: np.tanh(xs[0]),
    "Erf": lambda im, xs, at: _erf(xs[0]).astype(xs[0].dtype),
    "Reciprocal": lambda im, xs, at: 1 / xs[0],
    "Max": _variadic(np.maximum),
    "Min": _variadic(np.minimum),
    "Sum": _variadic(np.add),
    "ReduceSum": _fold_reduce(np.sum),
    "ReduceMean": _fold_reduce(np.mean),
    "ReduceMax": _fold_reduce(np.max),
    "ReduceMin": _fold_reduce(np.min),
    "ReduceProd": _fold_reduce(np.prod),
}


def _constant(at):
    if "value" in at:
        return at["value"]
    for key, dt in (("value_float", np.float32), ("value_floats", np.float32),
                    ("value_int", np.int64), ("value_ints", np.int64)):
        if key in at:
            return np.array(at[key], dt)
    raise NotImplementedError(f"Constant with attributes {sorted(at)} is not supported")


# ------------------------------------------------- building graph ops
def _unary(opname):
    return lambda im, ins, at: im.b.op(opname, im.tensor(ins[0]))


def _binary(opname):
    def build(im, ins, at):
        a, c = im.pair(ins[0], ins[1])
        return im.b.op(opname, a, c)
    return build


def _b_abs(im, ins, at):
    x = im.tensor(ins[0])
    return im.b.op("maximum", x, -x)


def _b_minimum(im, a: Tensor, c: Tensor) -> Tensor:
    return -im.b.op("maximum", -a, -c)


def _b_variadic(fn):
    def build(im, ins, at):
        out = im.tensor(ins[0])
        for name in ins[1:]:
            out = fn(im, out, im.operand(name, out))
        return out
    return build


def _b_gemm(im, ins, at):
    b = im.b
    y = b.matmul(im.tensor(ins[0]), im.tensor(ins[1]), trans_a=bool(at.get("transA", 0)),
                 trans_b=bool(at.get("transB", 0)))
    if at.get("alpha", 1.0) != 1.0:
        y = y * float(at["alpha"])
    if len(ins) > 2 and ins[2]:
        c = im.operand(ins[2], y)
        if at.get("beta", 1.0) != 1.0:
            c = c * float(at["beta"])
        y = y + c
    return y


def _b_matmul(im, ins, at):
    a, c = im.tensor(ins[0]), im.tensor(ins[1])
    trans_b = False
    node = im.b.g.nodes[c.id]
    rank = len(c.shape)
    if node.op == "transpose" and rank >= 2 and tuple(node.attr("perm")) == (
            tuple(range(rank - 2)) + (rank - 1, rank - 2)):
        c, trans_b = Tensor(im.b, node.inputs[0]), True  # x @ W.T without the transpose
    return im.b.matmul(a, c, trans_b=trans_b)


def _b_pow(im, ins, at):
    c = np.asarray(im.known(ins[1], "the exponent"))
    if c.size != 1:
        raise NotImplementedError(f"node {im.label!r}: Pow needs a one-element exponent, got {list(c.shape)}")
    x, c = im.tensor(ins[0]), float(c.reshape(()))
    return x if c == 1.0 else im.b.pow(x, c)


def _b_reshape(im, ins, at):
    x = im.tensor(ins[0])
    return im.b.reshape(x, _reshape_target(x.shape, im.known(ins[1], "the shape"), at.get("allowzero", 0)))


def _b_flatten(im, ins, at):
    x = im.tensor(ins[0])
    return im.b.reshape(x, _flatten_shape(x.shape, at.get("axis", 1)))


def _b_unsqueeze(im, ins, at):
    x = im.tensor(ins[0])
    axes = im.axes(ins, at, 0)
    return im.b.reshape(x, _unsqueeze_shape(x.shape, axes))


def _b_squeeze(im, ins, at):
    x = im.tensor(ins[0])
    return im.b.reshape(x, _squeeze_shape(x.shape, im.axes(ins, at, len(x.shape))))


def _b_reduce(kind):
    def build(im, ins, at):
        x = im.tensor(ins[0])
        axes = im.axes(ins, at, len(x.shape))
        if axes is None:
            if at.get("noop_with_empty_axes", 0):
                return x
            axes = list(range(len(x.shape)))
        keep = bool(at.get("keepdims", 1))
        if kind == "min":
            return -im.b.max(-x, axes, keep)
        return getattr(im.b, kind)(x, axes, keep)
    return build


def _b_softmax(opname):
    def build(im, ins, at):
        x = im.tensor(ins[0])
        fn = getattr(im.b, opname)
        if im.opset >= 13:
            return fn(x, at.get("axis", -1))
        # before opset 13: the input is coerced to 2-D at `axis` (default 1)
        shape = x.shape
        flat = im.b.reshape(x, _flatten_shape(shape, at.get("axis", 1)))
        return im.b.reshape(fn(flat, -1), shape)
    return build


def _b_cast(im, ins, at):
    x = im.tensor(ins[0])
    if at["to"] in _FLOAT:
        to = "f32"
    elif at["to"] in _INT - {9}:
        to = "i32"
    else:
        raise NotImplementedError(f"node {im.label!r}: Cast to ONNX type {at['to']} is not supported")
    return x if x.dtype == to else im.b.op("cast", x, to=to)


def _b_clip(im, ins, at):
    y = im.tensor(ins[0])
    lo = at.get("min", im.known(ins[1], "min") if len(ins) > 1 and ins[1] else None)
    hi = at.get("max", im.known(ins[2], "max") if len(ins) > 2 and ins[2] else None)
    if lo is not None:
        y = im.b.op("maximum", y, float(np.asarray(lo).reshape(())))
    if hi is not None:
        y = _b_minimum(im, y, im.b.const(float(np.asarray(hi).reshape(()))))
    return y


def _b_expand(im, ins, at):
    x = im.tensor(ins[0])
    shape = np.broadcast_shapes(x.shape, tuple(int(d) for d in im.known(ins[1], "the shape")))
    return x if tuple(shape) == x.shape else im.b.op("broadcast_to", x, shape=tuple(shape))


def _b_layer_norm(im, ins, at):
    b, x = im.b, im.tensor(ins[0])
    axes = list(range(at.get("axis", -1) % len(x.shape), len(x.shape)))
    d = x - b.mean(x, axes, True)
    y = d / b.sqrt(b.mean(d * d, axes, True) + float(at.get("epsilon", 1e-5)))
    y = y * im.operand(ins[1], y)
    return y + im.operand(ins[2], y) if len(ins) > 2 and ins[2] else y


_BUILD = {
    "Gemm": _b_gemm,
    "MatMul": _b_matmul,
    "Add": _binary("add"),
    "Sub": _binary("sub"),
    "Mul": _binary("mul"),
    "Div": _binary("div"),
    "Max": _b_variadic(lambda im, a, c: im.b.op("maximum", a, c)),
    "Min": _b_variadic(_b_minimum),
    "Sum": _b_variadic(lambda im, a, c: a + c),
    "Relu": _unary("relu"),
    "Sigmoid": _unary("sigmoid"),
    "Tanh": _unary("tanh"),
    "Exp": _unary("exp"),
    "Log": _unary("log"),
    "Sqrt": _unary("sqrt"),
    "Neg": _unary("neg"),
    "Erf": _unary("erf"),
    "Abs": _b_abs,
    "Reciprocal": lambda im, ins, at: 1.0 / im.tensor(ins[0]),
    "Gelu": lambda im, ins, at: im.b.gelu(im.tensor(ins[0]), at.get("approximate", "none")),
    "Pow": _b_pow,
    "Clip": _b_clip,
    "Identity": lambda im, ins, at: im.env[ins[0]],
    "Dropout": lambda im, ins, at: im.env[ins[0]],  # inference: identity
    "Cast": _b_cast,
    "Reshape": _b_reshape,
    "Flatten": _b_flatten,
    "Transpose": lambda im, ins, at: im.b.transpose(im.tensor(ins[0]), at.get("perm")),
    "Unsqueeze": _b_unsqueeze,
    "Squeeze": _b_squeeze,
    "Expand": _b_expand,
    "ReduceSum": _b_reduce("sum"),
    "ReduceMean": _b_reduce("mean"),
    "ReduceMax": _b_reduce("max"),
    "ReduceMin": _b_reduce("min"),
    "Softmax": _b_softmax("softmax"),
    "LogSoftmax": _b_softmax("log_softmax"),
    "LayerNormalization": _b_layer_norm,
}


def supported_ops() -> list:
    """ONNX op types the importer knows (some only on constant inputs, see _FOLD)."""
    return sorted(set(_BUILD) | set(_FOLD) | {"Shape", "Size"})

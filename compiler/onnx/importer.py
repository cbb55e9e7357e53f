"""ONNX -> Model: the ops that torch.onnx.export writes (opsets 13-21, both exporters),
and most of the ONNX node conformance suite that maps exactly onto meganeura's ops.

    model = load_onnx("mlp.onnx", batch_size=64)

Every ONNX value is either a graph Tensor (made with the Builder) or a known numpy
array (`Known`). Shape arithmetic (Shape, Gather, Concat, Unsqueeze, ...) whose inputs
are all known is folded here with numpy, so the Graph only holds tensor math.

Weights: float initializers become `Builder.param` named as the initializer, so that
`save_weights` writes the source model's names. The dynamo exporter marks which
initializers are PyTorch parameters (trainable) and buffers (frozen params); its other
initializers are exporter constants, folded like Constant nodes. A known float array
that must become a tensor is a scalar `Builder.const` when it has one element, else a
frozen param (`const.<output name>` for Constant nodes). BatchNormalization's running
mean and variance are always frozen.

Both exporters fold `W.T` of a Linear applied to a 3-D input into a new initializer.
The dynamo exporter records where it came from: W is imported under its PyTorch name
and the MatMul becomes matmul(trans_b). The TorchScript exporter does not: its
`onnx::MatMul_N` stays a trainable weight under that name unless the model is exported
with `do_constant_folding=False`, which keeps Transpose(W) (imported as trans_b too).
Exporters also merge equal tensors into one initializer: initializers.py gives each read
back the parameter the source model has (a tied LM head stays one), and the LSTM / GRU
weights the dynamo exporter folds become torch's own parameters (build_seq.py).

Booleans computed in the graph (Equal, Less, Not, ...) are float tensors holding 0 or 1
("masks"); integers of every width are i32 tensors (constants beyond 32 bits are refused
here, inputs by the runtime). float16 and bfloat16 are computed in f32, double is refused.
Where a graph input's or output's element type differs from what the GPU holds, the graph
records it (Graph.io_dtypes) and a Session converts at the boundary. See docs/ONNX.md
for the list of ops.
"""
from __future__ import annotations

import os

import numpy as np

from ..ir.builder import Builder, Model, Tensor
from .common import (BOOL_TYPE, DOUBLE_TYPE, FLOAT_TYPES, FOLDED_FROM_KEY, INT_TYPES, INPUT_KIND_KEY, SOURCE_DTYPES,
                     NARROW_FLOAT_TYPES, NARROW_INT_TYPES, type_only,
                     Known, as_i32, is_scalar, node_attrs, parse_names, refuse_double)
from .initializers import plan_sharing, recurrent_sources


def load_onnx(source, batch_size: int | None = None) -> Model:
    """Import an ONNX model into a Model, weights by their initializer names.

    Args:
        source: a path, the file's bytes, or an onnx.ModelProto.
        batch_size: what a dynamic first dimension of a graph input becomes (None: 64).

    Returns:
        The Model, for compile_model.

    Raises:
        NotImplementedError: an operator, attribute or input type it does not support (docs/ONNX.md).
        ValueError: an inconsistent graph, or a dynamic dimension other than the batch.
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
        self.node = None
        self.masks = set()  # ids of float tensors that hold an ONNX bool as 0.0 / 1.0
        self.users = {}  # parameter name -> the names of the nodes reading it (LoRA targets match them)
        g = proto.graph
        self.inits = {i.name for i in g.initializer}
        meta = {vi.name: {p.key: p.value for p in vi.metadata_props} for vi in list(g.value_info) + list(g.input)}
        kinds = {name: m[INPUT_KIND_KEY] for name, m in meta.items() if INPUT_KIND_KEY in m}
        linear = _folded_linear_weights(g, meta) if kinds else {}
        for init in g.initializer:
            value = numpy_helper.to_array(init)
            if init.name in linear:  # W.T folded out of aten.linear: import W under its own name
                self.env[init.name] = Known(value.T, linear[init.name], "param", transposed=True)
                continue
            if init.data_type not in FLOAT_TYPES:
                kind = "const"
            elif not kinds:  # no torch.export signature (the TorchScript exporter): all weights
                kind = "param"
            else:  # an initializer folded out of weights stays a weight
                sources = [kinds.get(n, _vanished_kind(n))
                           for n in parse_names(meta.get(init.name, {}).get(FOLDED_FROM_KEY, "[]"))]
                origin = [kinds.get(init.name)] + sources
                kind = "param" if "PARAMETER" in origin else "buffer" if "BUFFER" in origin else "const"
            self.env[init.name] = Known(value, init.name, kind)
        # which parameter each read of a weight is: exporters merge equal tensors (initializers.py)
        self.sharing = plan_sharing(g, self.env, meta, bool(kinds))
        # recurrent weights folded from torch's parameters: built from them (build_seq.py)
        self.rnn_sources = recurrent_sources(g, meta) if kinds else {}

    # ------------------------------------------------------------------ driver
    def run(self) -> Model:
        g = self.proto.graph
        for vi in g.input:
            if vi.name not in self.env:
                self.env[vi.name] = self._input(vi)
        for node in g.node:
            self._node(node)
        for vi in g.output:
            self.b.output(vi.name, self._output(vi))
        model = self.b.build()
        model.param_users = {name: tuple(nodes) for name, nodes in self.users.items()}
        model.initializer_notes = tuple(self.sharing.notes)
        return model

    def _output(self, vi) -> Tensor:
        """A graph output as a tensor of the GPU type its element type maps to (bool: a mask)."""
        elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        if elem == DOUBLE_TYPE:
            raise refuse_double(f"graph output {vi.name!r}")
        if elem in SOURCE_DTYPES:
            self.b.g.io_dtypes[("output", vi.name)] = SOURCE_DTYPES[elem]
        t = self.mask_of(vi.name) if elem == BOOL_TYPE else self.tensor(vi.name)
        want = ("f32" if elem in FLOAT_TYPES or elem in NARROW_FLOAT_TYPES or elem == BOOL_TYPE else
                "i32" if elem in INT_TYPES or elem in NARROW_INT_TYPES else t.dtype)
        if t.dtype != want:
            return self.b.op("cast", t, to=want)
        # a scalar constant (a folded Size) has no buffer: an output is computed into one
        return self.b.op("broadcast_to", t, shape=()) if self.b.g.nodes[t.id].op == "const" else t

    def _input(self, vi):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            raise NotImplementedError(f"graph input {vi.name!r} is not a tensor with a shape")
        if tt.elem_type == DOUBLE_TYPE:
            raise refuse_double(f"graph input {vi.name!r}")
        if tt.elem_type in FLOAT_TYPES or tt.elem_type in NARROW_FLOAT_TYPES:
            dtype = "f32"
        elif tt.elem_type in INT_TYPES or tt.elem_type in NARROW_INT_TYPES:
            dtype = "i32"
        else:
            raise NotImplementedError(f"graph input {vi.name!r} has ONNX element type {tt.elem_type}")
        shape = []
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value == 0 and type_only(self.proto.graph, vi.name):
                raise NotImplementedError(f"graph input {vi.name!r} is empty, read only for its element type (if at all): "
                                          f"that input ('{vi.name}') must be a constant")
            if d.HasField("dim_value") and d.dim_value == 0:
                raise NotImplementedError(f"graph input {vi.name!r} is empty (dimension {axis} is 0)")
            static = d.HasField("dim_value") and d.dim_value > 0
            if static:
                shape.append(d.dim_value)
            elif axis == 0:
                shape.append(self.batch)
            else:
                what = d.dim_param or d.dim_value or "unknown"
                raise ValueError(f"graph input {vi.name!r}: dimension {axis} is dynamic ({what}); "
                                 "only the first (batch) dimension may be dynamic")
        t = self.b.input(vi.name, tuple(shape), dtype)
        if tt.elem_type in SOURCE_DTYPES:
            self.b.g.io_dtypes[("input", vi.name)] = SOURCE_DTYPES[tt.elem_type]
        if tt.elem_type == BOOL_TYPE:  # 0 / 1 as i32
            t = self.b.op("cast", t, to="f32")
            self.masks.add(t.id)
        return t

    def import_node(self, node):
        """Import one node: also a node of an If / Loop / Scan body (build_seq.py)."""
        self._node(node)

    def _node(self, node):
        from .tables import BUILD, FOLD, INT_OK, PARAM_INPUTS

        op, label = node.op_type, node.name or (node.output[0] if node.output else "?")
        self.label, self.node = label, node
        if node.domain not in ("", "ai.onnx"):  # other domains' ops are BUILD's "domain::op" keys
            op = f"{node.domain}::{op}"
        if op not in BUILD and "::" in op:
            raise NotImplementedError(f"ONNX op {op} (node {label!r}) is not supported; "
                                      f"supported ops: {', '.join(supported_ops())}")
        for name in node.input:
            if name not in self.env:
                raise ValueError(f"node {label!r} ({op}) reads {name!r}, which nothing produced before it")
        at = node_attrs(node)
        inputs = self.sharing.inputs(node, self.env)  # a merged weight's read as its own parameter
        ins = [self.env[n] for n in inputs]
        for v in ins:
            if isinstance(v, Known) and v.kind == "param":
                self.users.setdefault(v.name, []).append(label)
        foldable = all(v is None or (isinstance(v, Known) and v.kind == "const") for v in ins)
        if op in ("Shape", "Size", "EyeLike"):  # only the input's shape matters
            s = self.known(inputs[0]).shape if isinstance(ins[0], Known) else ins[0].shape
            if op == "EyeLike":
                outs = FOLD[op](self, [np.zeros(s, np.float32 if ins[0].dtype == "f32" else np.int64)
                                       if isinstance(ins[0], Tensor) else ins[0].value], at)
            elif op == "Size":
                outs = [np.array(int(np.prod(s)), np.int64)]
            else:
                outs = [np.array(s, np.int64)[slice(at.get("start", 0), at.get("end"))]]
        elif foldable and op in FOLD:
            vals = [None if v is None else v.value for v in ins]
            try:
                outs = FOLD[op](self, vals, at)
            except NotImplementedError:
                raise
            except Exception as exc:
                raise ValueError(f"folding node {label!r} ({op}) failed: {exc}") from exc
        elif op in BUILD:
            skip = PARAM_INPUTS.get(op, PARAM_INPUTS["Reduce"] if op.startswith("Reduce") else ())
            if op not in INT_OK and any(isinstance(v, Tensor) and v.dtype == "i32" and i not in skip
                                        for i, v in enumerate(ins)):
                raise NotImplementedError(f"ONNX op {op} (node {label!r}) on an integer tensor is not "
                                          "supported (cast it to float)")
            outs = BUILD[op](self, inputs, at)
        else:
            if op in FOLD:
                raise NotImplementedError(f"ONNX op {op} (node {label!r}) is supported only on "
                                          "inputs known at import time (shape arithmetic)")
            raise NotImplementedError(f"ONNX op {op} (node {label!r}) is not supported; "
                                      f"supported ops: {', '.join(supported_ops())}")
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        for i, name in enumerate(node.output):
            if not name:
                continue
            if i >= len(outs) or outs[i] is None:
                raise NotImplementedError(f"node {label!r} ({op}): output {i} ({name!r}) is not supported")
            v = outs[i]
            self.env[name] = v if isinstance(v, (Tensor, Known)) else Known(np.asarray(v), name)

    # ------------------------------------------------------------------ values
    def tensor(self, name) -> Tensor:
        """The graph tensor of an ONNX value, making a param or const for a known one."""
        v = self.env[name]
        if isinstance(v, Tensor):
            return v
        if v.tensor is None:
            arr = v.value
            if arr.dtype.name == "bfloat16" or arr.dtype.name in NARROW_FLOAT_TYPES.values():  # (ml_dtypes' types)
                arr = arr.astype(np.float32)  # computed in f32
            elif arr.dtype.name in NARROW_INT_TYPES.values():
                arr = arr.astype(np.int32)
            if v.kind == "const" and arr.dtype == np.bool_:
                v.tensor = self.b.const(float(arr)) if arr.ndim == 0 else self.b.constant(arr.astype(np.float64))
                self.masks.add(v.tensor.id)
                return v.tensor
            if arr.size == 0:
                raise NotImplementedError(f"empty tensor {name!r} {list(arr.shape)}")
            if v.kind == "const" and arr.dtype.kind in "iu":
                ids = as_i32(name, arr)
                v.tensor = self.b.const(int(ids), "i32") if arr.ndim == 0 else self.b.constant_ids(ids)
            elif v.kind == "const" and arr.dtype.kind not in "fc":
                raise NotImplementedError(f"constant {name!r} of {arr.dtype} is used as a tensor")
            elif v.kind == "const" and arr.ndim == 0:
                v.tensor = self.b.const(float(arr))
            else:
                pname = v.name if v.kind != "const" or v.name in self.inits else f"const.{v.name}"
                v.tensor = self._param(pname, arr.astype(np.float32), v.kind != "param")
                if v.transposed:  # MatMul turns this into trans_b
                    v.tensor = self.b.transpose(v.tensor, (1, 0))
        return v.tensor

    def _param(self, name, value, frozen) -> Tensor:
        """Parameter `name`: the one declared already when it holds the same values (a weight
        the source model ties, read once as W and once as a folded W.T), else a new one."""
        i = self.b.g.named.get(("param", name))
        if i is None:
            return self.b.param(name, value, frozen=frozen)
        if np.array_equal(self.b.g.values[name], value):
            return Tensor(self.b, i)
        raise ValueError(f"the source model holds two different tensors named {name!r}")

    def known(self, name, what="this input"):
        """The numpy value of an input that must be known at import time."""
        v = self.env.get(name)
        if not isinstance(v, Known):
            src = self.source_input(v) if isinstance(v, Tensor) and v.id != self.b.g.named.get(("input", name)) else None
            if src is not None:  # named so that a caller can make that graph input a constant
                raise NotImplementedError(f"node {self.label!r}: {what} ({name!r}) is computed from graph input "
                                          f"{src!r}: that input ('{src}') must be a constant")
            raise NotImplementedError(f"node {self.label!r}: {what} ({name!r}) must be a constant")
        return v.value.T if v.transposed else v.value

    def source_input(self, t: Tensor):
        """The name of a graph input that tensor t is computed from, or None."""
        nodes, stack, seen = self.b.g.nodes, [t.id], set()
        while stack:
            i = stack.pop()
            if i not in seen:
                seen.add(i)
                if nodes[i].op == "input":
                    return nodes[i].attr("name")
                stack.extend(nodes[i].inputs)
        return None

    def opt(self, ins, i, what="this input"):
        """The known value of optional input i, or None when it is absent."""
        return self.known(ins[i], what) if len(ins) > i and ins[i] else None

    def operand(self, name, other: Tensor | None, dtype: str | None = None) -> Tensor:
        """A binary op's operand: a one-element constant becomes a scalar const, of the other
        operand's dtype (`dtype`, where there is no other)."""
        v = self.env[name]
        if is_scalar(v) and other is not None and v.value.ndim <= len(other.shape):
            value = v.value.reshape(())
            if (dtype or other.dtype) == "i32" and value.dtype.kind in "iu":
                return self.b.const(int(as_i32(name, value)), "i32")
            return self.b.const(float(value))
        return self.tensor(name)

    def pair(self, a, c):
        """Both operands of a binary op; a one-element constant side becomes a scalar."""
        if is_scalar(self.env[a]) and not is_scalar(self.env[c]):
            tc = self.tensor(c)
            return self.operand(a, tc), tc
        ta = self.tensor(a)
        return ta, self.operand(c, ta)

    def mask(self, t: Tensor) -> Tensor:
        """Mark a float tensor as holding a bool (0.0 / 1.0)."""
        self.masks.add(t.id)
        return t

    def mask_of(self, name) -> Tensor:
        """An ONNX bool value as a 0/1 float tensor (nonzero numbers are true)."""
        t = self.tensor(name)
        if t.id in self.masks:
            return t
        if t.dtype == "i32":
            t = self.b.op("cast", t, to="f32")
        if t.id not in self.masks and self.b.g.nodes[t.id].op != "const":
            t = 1.0 - self.b.op("eq", t, 0.0)
        return self.mask(t)

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


def _vanished_kind(name: str):
    """The kind of a folded initializer's source that left the graph entirely (the exporter
    folded every use of it, e.g. Gather(pos.weight, constant ids) or Unsqueeze(gn.weight)):
    a module's `weight` or `bias` is a parameter; other names are left unknown."""
    return "PARAMETER" if name.rsplit(".", 1)[-1] in ("weight", "bias") and "." in name else None


def _folded_linear_weights(g, meta) -> dict:
    """Initializers that torch's dynamo exporter folded from W.T of an aten.linear
    (x of rank 3 or more): initializer name -> the PyTorch parameter name of W."""
    out = {}
    for node in g.node:
        if node.op_type != "MatMul" or len(node.input) != 2:
            continue
        fx = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.fx_node"), "")
        src = parse_names(meta.get(node.input[1], {}).get(FOLDED_FROM_KEY, "[]"))
        if "aten.linear" in fx and len(src) == 1 and f"%p_{src[0].replace('.', '_')}" in fx:
            out[node.input[1]] = src[0]
    return out


def supported_ops() -> list:
    """ONNX op types the importer knows (some only on constant inputs, see tables.FOLD)."""
    from .tables import BUILD, FOLD
    return sorted(set(BUILD) | set(FOLD) | {"Shape", "Size"})

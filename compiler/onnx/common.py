"""Values and small helpers shared by the ONNX importer's modules."""
from __future__ import annotations

import ast
from dataclasses import dataclass

import numpy as np

from ..ir.builder import Tensor

INPUT_KIND_KEY = "pkg.torch.export.graph_signature.InputSpec.kind"
FOLDED_FROM_KEY = "pkg.onnxscript.optimizer.folded_from"
FLOAT_TYPES = frozenset({1, 10, 11, 16})  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
INT_TYPES = frozenset({2, 3, 4, 5, 6, 7, 9, 12, 13})  # (U)INT8-64, BOOL
BOOL_TYPE = 9
DOUBLE_TYPE = 11
# element types computed as f32 / i32 on the GPU whose values a Session converts at the
# boundary: ONNX type -> the name the package records (numpy's, and bfloat16)
SOURCE_DTYPES = {10: "float16", 16: "bfloat16", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 7: "int64",
                 9: "bool", 12: "uint32", 13: "uint64"}
# narrow types, computed as f32 (float8, float4, e8m0) and i32 (4- and 2-bit integers), by ml_dtypes' names
NARROW_FLOAT_TYPES = {17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz",
                      23: "float4_e2m1fn", 24: "float8_e8m0fnu"}
NARROW_INT_TYPES = {21: "uint4", 22: "int4", 25: "uint2", 26: "int2"}
SOURCE_DTYPES.update({**NARROW_FLOAT_TYPES, **NARROW_INT_TYPES})
I32_RANGE = (-(1 << 31), (1 << 31) - 1)


def type_only(graph, name: str) -> bool:
    """Is value `name` read only for its element type (as CastLike's `like`), or not at all? Then
    an empty one carries all it needs when it is a constant."""
    uses = [(n.op_type, list(n.input).index(name)) for n in graph.node if name in n.input]
    return all(u == ("CastLike", 1) for u in uses)


def refuse_double(what: str):
    """The error for a float64 value at the graph's boundary."""
    return NotImplementedError(f"{what} is double (float64): meganeura computes in float32; export the model "
                               "in float32 (e.g. model.float() before torch.onnx.export)")


def as_i32(name: str, arr) -> np.ndarray:
    """An integer array as int32, refusing values beyond the 32-bit range meganeura computes in."""
    arr = np.asarray(arr)
    if arr.size and arr.dtype.kind in "iu" and (arr.min() < I32_RANGE[0] or arr.max() > I32_RANGE[1]):
        bad = np.argwhere((arr < I32_RANGE[0]) | (arr > I32_RANGE[1]))[0]
        raise NotImplementedError(f"integer constant {name!r} holds {arr[tuple(bad)]} at index "
                                  f"{tuple(int(i) for i in bad)}, outside the 32-bit range integers are computed in")
    return arr.astype(np.int32)


@dataclass
class Known:
    """A value known at import time. kind: "const" (foldable), "param", "buffer"."""
    value: np.ndarray
    name: str
    kind: str = "const"
    transposed: bool = False  # the ONNX value is value.T (a folded W.T)
    tensor: Tensor | None = None  # made on first use as a graph tensor


def parse_names(text):
    try:
        names = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return [str(n) for n in names] if isinstance(names, (list, tuple, set)) else []


def is_scalar(v):
    return isinstance(v, Known) and v.kind == "const" and v.value.size == 1 and v.value.dtype.kind in "fiu"


def node_attrs(node) -> dict:
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


def np_dtype(onnx_type):
    from onnx import helper
    return helper.tensor_dtype_to_np_dtype(onnx_type)


def reshape_target(in_shape, shape, allowzero=0):
    shape = [int(d) for d in np.asarray(shape).reshape(-1)]
    out = [in_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = int(np.prod(in_shape)) // max(known, 1)
    return tuple(out)


def unsqueeze_shape(shape, axes):
    rank = len(shape) + len(axes)
    out = list(shape)
    for a in sorted(a % rank for a in axes):
        out.insert(a, 1)
    return tuple(out)


def squeeze_shape(shape, axes):
    if axes is None:
        return tuple(d for d in shape if d != 1)
    axes = {a % len(shape) for a in axes}
    for a in axes:
        if shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of shape {shape}")
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def flatten_shape(shape, axis):
    axis = axis % len(shape) if axis < 0 else axis
    return (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))


def as_ints(v):
    return [int(a) for a in np.asarray(v).reshape(-1)]

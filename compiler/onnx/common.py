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
    return isinstance(v, Known) and v.kind == "const" and v.value.size == 1 and v.value.dtype.kind == "f"


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

"""Graph builders for narrow number types and quantization: Cast / CastLike into float8, float4,
e8m0 and 4- / 2-bit integers (rounded on the GPU by the `round_to_format` row), QuantizeLinear,
DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul, QLinearConv, MatMulInteger, ConvInteger.

Quantized integers are i32 on the GPU and computed in f32: their differences and products are
whole numbers, exact while a sum stays below 2^24 (a K = 258 dot product of uint8 values does;
beyond, the sums round as f32 matmuls do, relative 6e-8). Scales and zero points may be graph
inputs, except the scales of QLinearMatMul / QLinearConv, which must be constants: their
product y = a_scale * b_scale / y_scale is computed once, as the ONNX reference does, in the
scales' own type.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..ir.builder import Tensor
from .build_math import BUILD_MATH
from .build_nn import BUILD_NN
from .common import NARROW_FLOAT_TYPES, NARROW_INT_TYPES, Known

# quantized integer types -> (least, greatest)
INT_RANGES = {2: (0, 255), 3: (-128, 127), 4: (0, 65535), 5: (-32768, 32767), 21: (0, 15), 22: (-8, 7),
              25: (0, 3), 26: (-2, 1)}
UINT8, FLOAT, FLOAT4E2M1, FLOAT8E8M0 = 2, 1, 23, 24
_TYPES = weakref.WeakKeyDictionary()  # importer -> {value name: ONNX element type} from shape inference


def elem_type(im, name) -> int:
    """The ONNX element type of value `name`: a constant's, else the graph's value info (from
    shape inference where the graph does not say), else what the GPU holds (FLOAT or INT32)."""
    from onnx import helper

    v = im.env[name]
    if isinstance(v, Known):
        return helper.np_dtype_to_tensor_dtype(v.value.dtype)
    types = _TYPES.get(im)
    if types is None or name not in types:
        g = im.proto.graph
        infos = list(g.input) + list(g.output) + list(g.value_info)
        if name not in {vi.name for vi in infos}:
            from onnx import shape_inference
            try:
                infos += list(shape_inference.infer_shapes(im.proto).graph.value_info)
            except Exception:  # noqa: BLE001  (an uninferable graph: fall back to the GPU type)
                pass
        types = _TYPES.setdefault(im, {})
        types.update({vi.name: vi.type.tensor_type.elem_type for vi in infos if vi.type.HasField("tensor_type")})
    return types.get(name) or (FLOAT if v.dtype == "f32" else 6)


def _f32(im, name) -> Tensor:
    t = im.tensor(name)
    return t if t.dtype == "f32" else im.b.op("cast", t, to="f32")


def _clamp(im, y, lo, hi):
    return -im.b.op("maximum", -im.b.op("maximum", y, float(lo)), -float(hi))


def round_to(im, x: Tensor, to: int, saturate: bool = True) -> Tensor:
    """f32 `x` rounded into narrow ONNX type `to` as Cast does: f32 for float types, i32 for ints."""
    b = im.b
    if to in NARROW_INT_TYPES:
        name = NARROW_INT_TYPES[to]
        if x.dtype == "i32":  # integers wrap into the type (higher bits dropped)
            lo, hi = INT_RANGES[to]
            return b.bitwise(x - lo, b.const(hi - lo, "i32"), kind="and") + lo
        return b.op("cast", b.op("round_to_format", x, kind=name), to="i32")
    x = x if x.dtype == "f32" else b.op("cast", x, to="f32")
    name = NARROW_FLOAT_TYPES[to]
    keep = saturate or to in (FLOAT4E2M1, FLOAT8E8M0)
    return b.op("round_to_format", x, kind=name if keep else name + "_unsaturated")


def _b_cast(im, ins, at, to=None):
    to = int(at["to"]) if to is None else to
    if to not in NARROW_FLOAT_TYPES and to not in NARROW_INT_TYPES:
        return BUILD_MATH["Cast"](im, ins, {**at, "to": to})
    if to == FLOAT8E8M0 and (at.get("round_mode", "up") != "up" or not at.get("saturate", 1)):
        raise NotImplementedError(f"node {im.label!r}: Cast to FLOAT8E8M0 rounds up and saturates only "
                                  f"(round_mode {at.get('round_mode')!r}, saturate {at.get('saturate')})")
    return round_to(im, im.tensor(ins[0]), to, bool(at.get("saturate", 1)))


def _b_cast_like(im, ins, at):
    to = elem_type(im, ins[1])
    if to not in NARROW_FLOAT_TYPES and to not in NARROW_INT_TYPES:
        return BUILD_MATH["CastLike"](im, ins, at)
    return _b_cast(im, ins, at, to)


def _per_axis(im, name, shape, at) -> Tensor:
    """A scale or zero point (f32) shaped to broadcast over x of `shape`: one value, one per
    index of `axis`, or one per block of `block_size` indices along it (repeated)."""
    b, v = im.b, im.env[name]
    axis, block = int(at.get("axis", 1)), int(at.get("block_size", 0) or 0)
    if isinstance(v, Known) and v.value.size == 1:
        return b.const(float(np.asarray(v.value, np.float64).reshape(())))
    t = _f32(im, name)
    size = int(np.prod(t.shape))
    if size == 1:
        return b.reshape(t, (1,) * len(shape)) if shape else b.reshape(t, ())
    axis %= len(shape)
    if not block:
        return b.reshape(t, tuple(d if a == axis else 1 for a, d in enumerate(shape)))
    s = t.shape
    rep = b.op("broadcast_to", b.reshape(t, s[:axis + 1] + (1,) + s[axis + 1:]),
               shape=s[:axis + 1] + (block,) + s[axis + 1:])
    full = b.reshape(rep, s[:axis] + (s[axis] * block,) + s[axis + 1:])
    if full.shape[axis] != shape[axis]:  # a last, partial block
        full = b.slice(full, starts=(0,) * len(s), steps=(1,) * len(s), shape=tuple(shape))
    return full


def _quantize(im, y: Tensor, zp, to: int, saturate: bool = True) -> Tensor:
    """x / scale (`y`) rounded to ONNX type `to`, plus the zero point `zp` (f32 or None)."""
    if to in INT_RANGES:
        y = im.b.round(y)
        y = y + zp if zp is not None else y
        return im.b.op("cast", _clamp(im, y, *INT_RANGES[to]), to="i32")
    if to in NARROW_FLOAT_TYPES and to != FLOAT8E8M0:
        return round_to(im, y + zp if zp is not None else y, to, saturate)
    raise NotImplementedError(f"node {im.label!r}: quantization to ONNX type {to} is not supported")


def _b_quantize(im, ins, at):
    if at.get("precision", 0) not in (0, FLOAT):
        raise NotImplementedError(f"node {im.label!r}: QuantizeLinear with precision {at['precision']} "
                                  "(x / y_scale is computed in float32)")
    x = _f32(im, ins[0])
    has_zp = len(ins) > 2 and bool(ins[2])
    to = elem_type(im, ins[2]) if has_zp else int(at.get("output_dtype", 0) or UINT8)
    y = x / _per_axis(im, ins[1], x.shape, at)
    zp = _per_axis(im, ins[2], x.shape, at) if has_zp else None
    return _quantize(im, y, zp, to, bool(at.get("saturate", 1)))


def _b_dequantize(im, ins, at):
    x = _f32(im, ins[0])
    if len(ins) > 2 and ins[2]:  # (zero for float8 and float4, as ONNX asks)
        x = x - _per_axis(im, ins[2], x.shape, at)
    return x * _per_axis(im, ins[1], x.shape, at)


def _b_dynamic_quantize(im, ins, at):
    """uint8 y, scale and zero point, as ONNX defines them from x's range widened to hold 0."""
    b, x = im.b, _f32(im, ins[0])
    axes = list(range(len(x.shape)))
    hi = b.op("maximum", b.max(x, axes), 0.0)
    lo = -b.op("maximum", b.max(-x, axes), 0.0)
    span = hi - lo
    scale = b.op("where", b.op("eq", span, 0.0), 1.0, span) / 255.0
    zp = b.round(_clamp(im, 0.0 - lo / scale, 0, 255))
    y = _quantize(im, x / scale, zp, UINT8)
    return [y, scale, b.op("cast", zp, to="i32")]


def _known_scale(im, ins, i, what):
    return np.asarray(im.known(ins[i], what))


def _shifted(im, ins, i, zp_index, per_rows=False) -> Tensor:
    """Input i minus its zero point (f32): one value, or per row (`per_rows`: of a matrix's
    second-to-last axis; else per last axis)."""
    x = _f32(im, ins[i])
    if len(ins) <= zp_index or not ins[zp_index]:
        return x
    zp = im.env[ins[zp_index]]
    n = zp.value.size if isinstance(zp, Known) else int(np.prod(zp.shape))
    z = _f32(im, ins[zp_index]) if not (isinstance(zp, Known) and n == 1) else float(zp.value.reshape(()))
    if n > 1:
        z = im.b.reshape(z, (n, 1) if per_rows else (n,))
    elif isinstance(z, Tensor):
        z = im.b.reshape(z, (1,) * len(x.shape))
    return x - z


def _requantize(im, acc: Tensor, scale: np.ndarray, ins, zp_index, default_to: int) -> Tensor:
    """An integer accumulator times the combined scale, rounded into the output type."""
    b = im.b
    mult = b.const(float(scale.reshape(()))) if scale.size == 1 else b.constant(scale.astype(np.float64))
    has_zp = len(ins) > zp_index and bool(ins[zp_index])
    to = elem_type(im, ins[zp_index]) if has_zp else default_to
    zp = _f32(im, ins[zp_index]) if has_zp else None
    if zp is not None and int(np.prod(zp.shape)) == 1:
        zp = b.reshape(zp, (1,) * len(acc.shape))
    return _quantize(im, acc * mult, zp, to)


def _b_qlinear_matmul(im, ins, at):
    sa, sb, sy = (_known_scale(im, ins, i, w) for i, w in ((1, "a_scale"), (4, "b_scale"), (6, "y_scale")))
    sa = sa.reshape(-1, 1) if sa.size > 1 else sa.reshape(())
    sb = sb.reshape(-1) if sb.size > 1 else sb.reshape(())
    acc = im.b.matmul(_shifted(im, ins, 0, 2, per_rows=True), _shifted(im, ins, 3, 5))
    return _requantize(im, acc, np.asarray(sa * sb / sy), ins, 7, elem_type(im, ins[0]))


def _conv(im, x: Tensor, w: Tensor, at, bias=None) -> Tensor:
    """ONNX Conv (any rank, padding, groups) of two f32 tensors, through its builder."""
    names = [f"{im.label}/x", f"{im.label}/w"] + ([f"{im.label}/b"] if bias is not None else [])
    for n, t in zip(names, (x, w, bias)):
        im.env[n] = t
    return BUILD_NN["Conv"](im, names, at)


def _weights_shifted(im, ins, i, zp_index) -> Tensor:
    """Conv weights minus their zero point: one value, or one per output channel."""
    w = _f32(im, ins[i])
    if len(ins) <= zp_index or not ins[zp_index]:
        return w
    z = _f32(im, ins[zp_index])
    n = int(np.prod(z.shape))
    return w - im.b.reshape(z, ((n,) + (1,) * (len(w.shape) - 1)) if n > 1 else (1,) * len(w.shape))


def _b_conv_integer(im, ins, at):
    acc = _conv(im, _shifted(im, ins, 0, 2), _weights_shifted(im, ins, 1, 3), at)
    return im.b.op("cast", acc, to="i32")


def _b_qlinear_conv(im, ins, at):
    sx, sw, sy = (_known_scale(im, ins, i, w) for i, w in ((1, "x_scale"), (4, "w_scale"), (6, "y_scale")))
    x = _shifted(im, ins, 0, 2)
    bias = _f32(im, ins[8]) if len(ins) > 8 and ins[8] else None
    acc = _conv(im, x, _weights_shifted(im, ins, 3, 5), at, bias)
    sw = sw.reshape((1, -1) + (1,) * (len(acc.shape) - 2)) if sw.size > 1 else sw.reshape(())
    return _requantize(im, acc, np.asarray(sx * sw / sy), ins, 7, elem_type(im, ins[0]))


def _b_matmul_integer(im, ins, at):
    acc = im.b.matmul(_shifted(im, ins, 0, 2, per_rows=True), _shifted(im, ins, 1, 3))
    return im.b.op("cast", acc, to="i32")


BUILD_QUANT = {
    "Cast": _b_cast,
    "CastLike": _b_cast_like,
    "QuantizeLinear": _b_quantize,
    "DequantizeLinear": _b_dequantize,
    "DynamicQuantizeLinear": _b_dynamic_quantize,
    "QLinearMatMul": _b_qlinear_matmul,
    "QLinearConv": _b_qlinear_conv,
    "MatMulInteger": _b_matmul_integer,
    "ConvInteger": _b_conv_integer,
}
# ops that take integer tensors (quantized values, zero points)
QUANT_INT_OK = frozenset(BUILD_QUANT)

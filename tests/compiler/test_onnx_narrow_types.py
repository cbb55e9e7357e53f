"""Narrow element types (float8, float4, e8m0, 4- and 2-bit integers) and quantization.

The runtime's boundary rounding (runtime/formats.py) against ml_dtypes and ONNX's conversions on
every value of each format and on ties, overflow and special values; ONNX models with narrow
inputs and outputs, Cast inside the graph, and quantize / dequantize round trips, run through a
Session and compared with onnx.reference. (The GPU's rounding row, round_to_format, is checked
against the same references, on the GPU and in the interpreter, by test_ops.py's cases.)
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from meganeura.compiler import compile_graph
from meganeura.compiler.onnx_import import load_onnx
from meganeura.runtime import InputError, Package, Session
from meganeura.runtime.formats import FLOATS, INTS, round_e8m0, round_float, to_source, wrap_int
from onnx import TensorProto, helper
from onnx.numpy_helper import saturate_cast, to_float8e8m0
from onnx.reference import ReferenceEvaluator
from op_cases_formats import FLOAT8, held, probes


def _same(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(got, want)  # (NaN equals NaN here)


@pytest.mark.parametrize("name", sorted(FLOATS))
def test_round_float_matches_ml_dtypes(name):
    x = probes(name).astype(np.float32)
    dt = getattr(ml_dtypes, name)
    with np.errstate(invalid="ignore", over="ignore"):
        want = saturate_cast(x, dt) if name in FLOAT8 else x.astype(dt)
    _same(round_float(x, name), want.astype(np.float32))
    if name in FLOAT8:
        with np.errstate(invalid="ignore", over="ignore"):
            _same(round_float(x, name, saturate=False), x.astype(dt).astype(np.float32))
    v = held(name).astype(np.float32)  # every value the format holds comes back unchanged
    _same(to_source(v, name), v)
    _same(round_float(v, name), v)


def test_boundary_keeps_infinities_the_format_holds():
    x = np.array([np.inf, -np.inf, 1e6], np.float32)
    _same(to_source(x, "float8_e5m2"), [np.inf, -np.inf, 57344.0])  # held: stay; beyond: saturate
    _same(to_source(x, "float8_e4m3fn"), [448.0, -448.0, 448.0])  # no infinity: saturate
    _same(round_float(x, "float8_e5m2"), [57344.0, -57344.0, 57344.0])  # Cast's default saturates them


def test_round_e8m0_matches_onnx():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(4000) * 10.0 ** rng.integers(-30, 30, 4000),
                        [0.0, 1.0, 0.75, 2.0 ** 127, 3e38, np.inf, np.nan, 2.0 ** -126]]).astype(np.float32)
    _same(round_e8m0(x), to_float8e8m0(x).astype(np.float32))
    # powers of two, 2^-127 (an f32 subnormal) included, are held as they are
    p = np.ldexp(1.0, np.arange(-127, 128)).astype(np.float32)
    _same(round_e8m0(p), p)


@pytest.mark.parametrize("name", sorted(INTS))
def test_wrap_int(name):
    v = np.arange(-40, 41)
    _same(wrap_int(v, name), v.astype(np.int8).astype(getattr(ml_dtypes, name)).astype(np.int32))


# ------------------------------------------------------------------ models through a Session
def _model(nodes, inputs, outputs, inits=(), opset=23):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _run(device, model, feeds):
    graph = load_onnx(model).graph
    session = Session(device, Package.from_bytes(compile_graph(graph)))
    out = session.run("infer", feeds, check_finite=False)
    want = ReferenceEvaluator(model).run(None, feeds)
    return [out[vi.name] for vi in model.graph.output], want


def test_cast_to_float8_rounds_inside_the_graph(device):
    """A Cast to float8 followed by more math sees the rounded value (2.3 -> 2.25 in e4m3fn)."""
    m = _model([helper.make_node("Cast", ["x"], ["q"], to=TensorProto.FLOAT8E4M3FN),
                helper.make_node("Cast", ["q"], ["f"], to=TensorProto.FLOAT),
                helper.make_node("Mul", ["f", "x"], ["y"])],
               [("x", TensorProto.FLOAT, [6])], [("y", TensorProto.FLOAT, [6]), ("q", TensorProto.FLOAT8E4M3FN, [6])])
    x = np.array([2.3, -0.1, 500.0, 1e-3, 17.0, -3.0], np.float32)
    (y, q), (wy, wq) = _run(device, m, {"x": x})
    _same(q, wq.astype(np.float32))
    np.testing.assert_allclose(y, wy, rtol=1e-6)
    assert y[0] == np.float32(2.25) * np.float32(2.3)


def test_narrow_inputs_and_outputs(device):
    """float8 / int4 inputs as ml_dtypes arrays (or their values as float32 / int32), outputs
    as float32 / int32 holding the narrow type's values; int4 inputs outside [-8, 7] refused."""
    m = _model([helper.make_node("Cast", ["a"], ["y"], to=TensorProto.FLOAT),
                helper.make_node("Cast", ["n"], ["m"], to=TensorProto.INT4),
                helper.make_node("Identity", ["a"], ["z"])],
               [("a", TensorProto.FLOAT8E5M2, [4]), ("n", TensorProto.INT4, [4])],
               [("y", TensorProto.FLOAT, [4]), ("m", TensorProto.INT4, [4]), ("z", TensorProto.FLOAT8E5M2, [4])])
    a = np.array([1.5, -57344.0, np.inf, 0.0], np.float32).astype(ml_dtypes.float8_e5m2)
    n = np.array([-8, 7, 0, -1], dtype=ml_dtypes.int4)
    (y, mm, z), (wy, wm, wz) = _run(device, m, {"a": a, "n": n})
    _same(y, wy)
    _same(z, wz.astype(np.float32))
    assert mm.dtype == np.int32
    _same(mm, wm.astype(np.int32))
    session = Session(device, Package.from_bytes(compile_graph(load_onnx(m).graph)))
    with pytest.raises(InputError, match=r"int4 .* \[-8, 7\]"):
        session.run("infer", {"a": a, "n": np.array([0, 8, 0, 0], np.int32)}, check_finite=False)


@pytest.mark.parametrize("to", [TensorProto.UINT8, TensorProto.INT8, TensorProto.INT4, TensorProto.UINT2,
                                TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2, TensorProto.FLOAT4E2M1])
def test_quantize_dequantize_round_trip(device, to):
    """QuantizeLinear -> DequantizeLinear, per channel (axis 1) and blocked (axis 2, blocks of 3
    with a partial last block), with ties on purpose, as onnx.reference computes it."""
    rng = np.random.default_rng(to)
    x = (rng.integers(-400, 400, (2, 3, 7)) * 0.25).astype(np.float32)
    zp_dt = helper.tensor_dtype_to_np_dtype(to)
    integer = to in (TensorProto.UINT8, TensorProto.INT8, TensorProto.INT4, TensorProto.UINT2)
    zp_axis = np.array([1, 0, 2] if integer else [0, 0, 0]).astype(zp_dt)
    zp_block = np.zeros((2, 3, 3)).astype(zp_dt)
    inits = [helper.make_tensor("s1", TensorProto.FLOAT, [3], [0.5, 2.0, 8.0]),
             helper.make_tensor("z1", to, [3], zp_axis.astype(np.float32).tolist()),
             helper.make_tensor("s2", TensorProto.FLOAT, [2, 3, 3], (rng.integers(1, 8, 18) * 0.5).tolist()),
             helper.make_tensor("z2", to, [2, 3, 3], zp_block.astype(np.float32).tolist())]
    m = _model([helper.make_node("QuantizeLinear", ["x", "s1", "z1"], ["q1"], axis=1),
                helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"], axis=1),
                helper.make_node("QuantizeLinear", ["x", "s2", "z2"], ["q2"], axis=2, block_size=3),
                helper.make_node("DequantizeLinear", ["q2", "s2", "z2"], ["d2"], axis=2, block_size=3)],
               [("x", TensorProto.FLOAT, [2, 3, 7])],
               [("d1", TensorProto.FLOAT, [2, 3, 7]), ("q2", to, [2, 3, 7]), ("d2", TensorProto.FLOAT, [2, 3, 7])],
               inits)
    got, want = _run(device, m, {"x": x})
    for g, w in zip(got, want):
        _same(g, np.asarray(w).astype(np.float64))

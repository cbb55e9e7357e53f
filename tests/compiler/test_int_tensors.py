"""Integer, boolean and half tensors through import, compile and Session: integer arithmetic
computed exactly on the GPU and in the interpreter (against onnx's reference evaluator and
torch), ArgMax / TopK outputs, a segmentation model ending in ArgMax exported by torch, the
element types at the graph's boundary, and the range checks on integers."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from meganeura.compiler import compile_graph, compile_model, run_graph
from meganeura.compiler.onnx_import import load_onnx
from meganeura.runtime import InputError, Package, Session
from meganeura.runtime.errors import PackageError
from meganeura.runtime.manifest_checks import check_layout

I64, BOOL = TensorProto.INT64, TensorProto.BOOL
SHAPE = [4, 6]


def _int_graph():
    """Integer ONNX ops on two int64 inputs `a`, `b` [4, 6] (b nonzero), every result an output."""
    n = helper.make_node
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.int64), name)  # noqa: E731
    nodes = [n("Add", ["a", "b"], ["add"]), n("Sub", ["a", "three"], ["sub"]), n("Mul", ["a", "b"], ["mul"]),
             n("Div", ["a", "b"], ["div"]), n("Mod", ["a", "b"], ["mod"]), n("Mod", ["a", "b"], ["fmod"], fmod=1),
             n("Min", ["a", "b"], ["min"]), n("Max", ["a", "b", "three"], ["max"]), n("Neg", ["a"], ["neg"]),
             n("Abs", ["a"], ["abs"]), n("Sign", ["a"], ["sign"]), n("BitwiseAnd", ["a", "b"], ["and"]),
             n("BitwiseXor", ["a", "b"], ["xor"]), n("BitwiseNot", ["a"], ["not"]),
             n("BitShift", ["abs", "two"], ["shl"], direction="LEFT"),
             n("Equal", ["a", "b"], ["eq"]), n("Less", ["a", "b"], ["lt"]), n("GreaterOrEqual", ["a", "three"], ["ge"]),
             n("Where", ["lt", "a", "b"], ["where"]), n("Clip", ["a", "lo", "hi"], ["clip"]),
             n("Mod", ["abs", "four"], ["rows"]), n("Gather", ["a", "rows"], ["gather"], axis=0),
             n("Slice", ["a", "s0", "s1", "s_ax", "s_st"], ["slice"]), n("Concat", ["a", "b"], ["concat"], axis=1),
             n("Reshape", ["a", "shape"], ["reshape"]), n("Pad", ["a", "pads", "seven"], ["pad"]),
             n("Expand", ["three", "shape2"], ["expand"]), n("Tile", ["b", "reps"], ["tile"]),
             n("Cast", ["a"], ["af"], to=TensorProto.FLOAT), n("Mul", ["af", "half"], ["ah"]),
             n("Cast", ["ah"], ["cast"], to=I64), n("ReduceSum", ["a", "ax1"], ["rsum"], keepdims=0),
             n("ArgMax", ["a"], ["argmax"], axis=1, keepdims=0), n("ArgMin", ["b"], ["argmin"], axis=0,
                                                                   select_last_index=1),
             n("TopK", ["a", "k3"], ["topv", "topi"], axis=1), n("TopK", ["b", "k3"], ["lowv", "lowi"], axis=0,
                                                                    largest=0)]
    inits = [c("three", 3), c("two", 2), c("four", 4), c("lo", -20), c("hi", 25), c("seven", 7),
             c("s0", [1, 0]), c("s1", [4, 6]), c("s_ax", [0, 1]), c("s_st", [2, 2]), c("shape", [6, 4]),
             c("pads", [0, 1, 1, 0]), c("shape2", [2, 3]), c("reps", [1, 2]), c("ax1", [1]), c("k3", [3]),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    bools = {"eq", "lt", "ge"}
    outs = [o for nd in nodes for o in nd.output if o not in ("af", "ah", "rows")]
    graph = helper.make_graph(nodes, "ints", [helper.make_tensor_value_info(x, I64, SHAPE) for x in "ab"],
                              [helper.make_tensor_value_info(o, BOOL if o in bools else I64, None) for o in outs],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _feed():
    rng = np.random.default_rng(31)
    a = rng.integers(-40, 40, SHAPE).astype(np.int64)
    b = rng.integers(1, 9, SHAPE).astype(np.int64) * rng.choice([-1, 1], SHAPE)
    a[0, :4] = [7, -7, 7, -7]
    b[0, :4] = [2, 2, -2, -2]  # every sign of a remainder
    a[1, :3] = a[1, 3]  # ties for ArgMax and TopK
    return {"a": a, "b": b}


@pytest.fixture(scope="module")
def int_session(device):
    model = load_onnx(_int_graph())
    return model, Session(device, Package.from_bytes(compile_graph(model.graph)))


def test_integer_ops_match_onnx_reference_and_torch_exactly(int_session):
    model, session = int_session
    feed = _feed()
    want = dict(zip([o.name for o in _int_graph().graph.output], ReferenceEvaluator(_int_graph()).run(None, feed)))
    got = session.run("infer", feed)
    interp = run_graph(model.graph, feed)[0]
    for name, w in want.items():
        expect = w.astype(np.int32) if w.dtype.kind in "iu" else w
        assert got[name].dtype == expect.dtype, (name, got[name].dtype)
        np.testing.assert_array_equal(got[name], expect, err_msg=f"GPU {name}")
        np.testing.assert_array_equal(interp[name], expect, err_msg=f"interpreter {name}")
        assert interp[name].dtype.kind == ("f" if w.dtype == np.bool_ else "i"), (name, interp[name].dtype)
    a, b = torch.tensor(feed["a"]), torch.tensor(feed["b"])
    np.testing.assert_array_equal(got["div"], torch.div(a, b, rounding_mode="trunc").numpy())
    np.testing.assert_array_equal(got["mod"], torch.remainder(a, b).numpy())
    np.testing.assert_array_equal(got["fmod"], torch.fmod(a, b).numpy())
    np.testing.assert_array_equal(got["xor"], torch.bitwise_xor(a, b).numpy())
    top = torch.topk(a, 3, dim=1)
    np.testing.assert_array_equal(got["topv"], top.values.numpy())
    np.testing.assert_array_equal(got["argmax"], torch.argmax(a, dim=1).numpy())


def test_integer_inputs_are_range_checked_at_upload(int_session):
    _, session = int_session
    feed = _feed()
    feed["a"][2, 3] = 2 ** 40
    with pytest.raises(InputError, match=r"input 'a' \(int64 in the source model\) holds 1099511627776 at index "
                                         r"\(2, 3\), outside the 32-bit integer range"):
        session.run("infer", feed)
    feed["a"][2, 3] = -2 ** 31  # the edge itself fits
    assert session.run("infer", feed)["abs"][2, 3] == -2 ** 31


def _tiny(nodes, inputs, outputs, inits=(), opset=18):
    return helper.make_model(helper.make_graph(nodes, "t", inputs, outputs, list(inits)),
                             opset_imports=[helper.make_opsetid("", opset)])


def test_import_refuses_what_32_bits_and_float32_cannot_hold():
    big = numpy_helper.from_array(np.array([1, 2 ** 35], np.int64), "big")
    m = _tiny([helper.make_node("Add", ["x", "big"], ["y"])], [helper.make_tensor_value_info("x", I64, [2])],
              [helper.make_tensor_value_info("y", I64, [2])], [big])
    with pytest.raises(NotImplementedError, match=r"'big' holds 34359738368 at index \(1,\), outside the 32-bit"):
        load_onnx(m)
    dbl = _tiny([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2])],
                [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2])])
    with pytest.raises(NotImplementedError, match=r"input 'x' is double \(float64\).*export the model in float32"):
        load_onnx(dbl)


def test_half_bool_and_narrow_integers_at_the_boundary(device):
    """float16 in and out (computed in f32, rounded once), bool out, uint8 arithmetic wrapping
    as uint8's does, and the package recording each source type."""
    f16, u8 = TensorProto.FLOAT16, TensorProto.UINT8
    m = _tiny([helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Greater", ["x", "zero"], ["pos"]),
               helper.make_node("Sub", ["p", "q"], ["d"])],
              [helper.make_tensor_value_info("x", f16, [3, 5]), helper.make_tensor_value_info("p", u8, [7]),
               helper.make_tensor_value_info("q", u8, [7])],
              [helper.make_tensor_value_info("sq", f16, [3, 5]), helper.make_tensor_value_info("pos", BOOL, [3, 5]),
               helper.make_tensor_value_info("d", u8, [7])],
              [numpy_helper.from_array(np.array(0, np.float16), "zero")])
    pkg = Package.from_bytes(compile_model(load_onnx(m)))
    assert {t.name: t.source for t in pkg.parsed.tensors if t.role in ("input", "output")} == {
        "x": "float16", "p": "uint8", "q": "uint8", "sq": "float16", "pos": "bool", "d": "uint8"}
    bad = copy.deepcopy(pkg.manifest)  # a package is untrusted: a source type its dtype cannot have is refused
    next(t for t in bad["tensors"] if t["name"] == "d")["source"] = "float16"
    with pytest.raises(PackageError, match=r"source: 'float16' is no source type of an i32 output"):
        check_layout(bad)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 5)) * 30).astype(np.float16)
    p, q = rng.integers(0, 256, 7).astype(np.uint8), rng.integers(0, 256, 7).astype(np.uint8)
    out = Session(device, pkg).run("infer", {"x": x, "p": p, "q": q})
    assert out["sq"].dtype == np.float16 and out["pos"].dtype == np.bool_ and out["d"].dtype == np.int32
    np.testing.assert_array_equal(out["sq"], (x.astype(np.float32) ** 2).astype(np.float16))
    np.testing.assert_array_equal(out["pos"], x > 0)
    np.testing.assert_array_equal(out["d"], (p - q).astype(np.int32))  # numpy's uint8 wraps too


class _Segmenter(torch.nn.Module):
    """A per-pixel classifier: two convolutions, class ids by ArgMax over the channels."""

    def __init__(self, classes=5):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.Conv2d(8, classes, 1))

    def forward(self, x):
        return torch.argmax(self.body(x), dim=1)


def test_segmentation_model_ending_in_argmax_returns_int32_class_maps(device, tmp_path):
    torch.manual_seed(0)
    net = _Segmenter().eval()
    x = torch.randn(2, 3, 12, 16)
    path = tmp_path / "seg.onnx"
    with warnings.catch_warnings():  # (the TorchScript exporter's deprecation notice)
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), str(path), input_names=["image"], output_names=["classes"], opset_version=17,
                          dynamo=False)
    assert any(nd.op_type == "ArgMax" for nd in onnx.load(str(path)).graph.node)
    session = Session(device, Package.from_bytes(compile_model(load_onnx(path, batch_size=2))))
    got = session.run("infer", {"image": x.numpy()})["classes"]
    with torch.no_grad():
        logits = copy.deepcopy(net.body).double()(x.double())
    want = torch.argmax(logits, dim=1).numpy()
    assert got.dtype == np.int32 and got.shape == (2, 12, 16)
    top2 = torch.topk(logits, 2, dim=1).values.numpy()
    clear = (top2[:, 0] - top2[:, 1]) > 1e-4  # pixels whose two best classes float32 can tell apart
    assert clear.mean() > 0.95
    np.testing.assert_array_equal(got[clear], want[clear])

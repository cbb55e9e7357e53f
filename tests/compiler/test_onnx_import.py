"""ONNX import: torch modules exported with both exporters, run by the interpreter,
compared with torch (float64) on full tensors."""
import copy
import importlib.util
import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
from torch import nn

from compiler.interpret import run_graph
from compiler.onnx_import import load_onnx

HAVE_ONNXSCRIPT = importlib.util.find_spec("onnxscript") is not None
BATCH = 5  # imported batch; exports trace with 3 rows and a dynamic first dimension


# ---------------------------------------------------------------- modules
class Softmaxes(nn.Module):
    def forward(self, x):  # x: [B, 6, 5]; dim 1 is not the last axis
        return torch.softmax(x, 1), torch.log_softmax(x, dim=1)


class Reductions(nn.Module):
    def forward(self, x):  # x: [B, 6, 5]
        return (x.sum(1, keepdim=True) + x.mean(1, keepdim=True) - x.amax(1, keepdim=True),
                x.sum(dim=(1, 2)) + x.mean(dim=2).amax(1), x.amax(2, keepdim=True) * x.mean(-1, keepdim=True))


class Shapes(nn.Module):
    def forward(self, x):  # x: [B, 64]
        y = x.reshape(x.shape[0], 8, 8).transpose(1, 2)
        z = x.view(-1, 4, 16).permute(0, 2, 1)
        return torch.flatten(y, 1), z.reshape(-1, 64) + 1.0, z.flatten(1)


class Elementwise(nn.Module):
    def forward(self, x):  # x: [B, 64]
        return (x ** 2 + torch.sqrt(x * x + 1.0), torch.exp(-x) + torch.log(1.0 + torch.sigmoid(x)),
                torch.tanh(x) - x ** 3 * 0.5)


class Divide(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(64) + 0.5)

    def forward(self, x, y):  # x: [B, 64], y: [B, 1]
        return x / (y * y + 1.0) + x / self.scale, 2.0 / (x * x + 1.0)


class Misc(nn.Module):
    """Cast of an integer input, unsqueeze/squeeze, maximum, dropout (eval), matmul."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8) * 0.3)
        self.drop = nn.Dropout(0.5)

    def forward(self, x, k):  # x: [B, 16] float, k: [B] int64
        kf = k.to(torch.float32).unsqueeze(1)  # [B, 1]
        h = torch.maximum(self.drop(x) @ self.w, kf * 0.1)
        return h.unsqueeze(1).squeeze(1) * 2.0


def mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def gelu(approximate):
    return lambda: nn.Sequential(nn.Linear(64, 32), nn.GELU(approximate=approximate))


def layer_norm():
    return nn.Sequential(nn.Linear(24, 16), nn.LayerNorm(16))


# name -> (module factory, input specs: shape after the batch, dtype)
MODELS = {
    "mlp": (mlp, [((64,), "f")]),
    "gelu_none": (gelu("none"), [((64,), "f")]),
    "gelu_tanh": (gelu("tanh"), [((64,), "f")]),
    "softmax": (Softmaxes, [((6, 5), "f")]),
    "reduce": (Reductions, [((6, 5), "f")]),
    "shapes": (Shapes, [((64,), "f")]),
    "elementwise": (Elementwise, [((64,), "f")]),
    "divide": (Divide, [((64,), "f"), ((1,), "f")]),
    "misc": (Misc, [((16,), "f"), ((), "i")]),
    "layer_norm": (layer_norm, [((24,), "f")]),
}

# (exporter, opset): the TorchScript exporter at 13, 17, 20; the dynamo exporter starts at 18
CASES = [(name, "torchscript", opset) for name in MODELS for opset in (13, 17, 20)]
if HAVE_ONNXSCRIPT:
    # softmax and layer_norm export the same single ops as the TorchScript exporter: left out for time
    CASES += [(name, "dynamo", 20) for name in MODELS if name not in ("softmax", "layer_norm")]
    CASES += [(name, "dynamo", 18) for name in ("gelu_none", "gelu_tanh")]  # no Gelu op before 20


def make_inputs(specs, rows, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for shape, kind in specs:
        if kind == "f":
            out.append(rng.standard_normal((rows,) + shape).astype(np.float32))
        else:
            out.append(rng.integers(0, 10, (rows,) + shape).astype(np.int64))
    return out


def export(module, args, exporter, opset):
    names = [f"in{i}" for i in range(len(args))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            f = io.BytesIO()
            torch.onnx.export(module, args, f, dynamo=False, opset_version=opset, input_names=names,
                              dynamic_axes={n: {0: "batch"} for n in names})
            return f.getvalue()
        batch = torch.export.Dim("batch", min=2, max=1024)
        prog = torch.onnx.export(module, args, dynamo=True, opset_version=opset, verbose=False,
                                 dynamic_shapes=tuple({0: batch} for _ in args))
        return prog.model_proto


def float_initializers(proto):
    from onnx import TensorProto
    return {i.name for i in proto.graph.initializer if i.data_type == TensorProto.FLOAT}


@pytest.mark.parametrize("name,exporter,opset", CASES, ids=[f"{n}-{e}-{o}" for n, e, o in CASES])
def test_torch_export_matches_torch(name, exporter, opset):
    factory, specs = MODELS[name]
    torch.manual_seed(0)
    module = factory().eval()
    proto = export(module, tuple(torch.from_numpy(a) for a in make_inputs(specs, 3, seed=1)), exporter, opset)
    if isinstance(proto, bytes):
        proto = onnx.load_from_string(proto)
    model = load_onnx(proto, batch_size=BATCH)

    # weights keep the source model's names: the ONNX initializer names, PyTorch's state_dict keys
    state = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    assert set(model.params) == set(state)
    assert set(model.params) <= float_initializers(proto)
    for k, v in model.params.items():
        np.testing.assert_array_equal(v, state[k])

    inputs = make_inputs(specs, BATCH, seed=2)
    g = model.graph
    assert [g.nodes[i].shape for i in g.inputs.values()] == [a.shape for a in inputs]
    feed = dict(zip(g.inputs, inputs))
    ref64 = copy.deepcopy(module).double()
    with torch.no_grad():
        want = ref64(*(torch.from_numpy(a.astype(np.float64) if a.dtype.kind == "f" else a) for a in inputs))
    want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
    assert list(g.outputs) == [o.name for o in proto.graph.output]
    for dtype, tol in ((np.float64, 1e-6), (np.float32, 1e-4)):
        outs, _ = run_graph(g, feed, dtype)
        got = list(outs.values())
        assert len(got) == len(want)
        for a, w in zip(got, want):
            assert a.shape == w.shape and a.dtype == dtype
            np.testing.assert_allclose(a, w, rtol=tol, atol=tol * max(1.0, np.abs(w).max()))


def test_mlp_parameter_names_and_shapes():
    torch.manual_seed(0)
    module = mlp().eval()
    data = export(module, (torch.randn(3, 64),), "torchscript", 17)
    model = load_onnx(data)
    assert list(model.params) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    g = model.graph
    assert g.nodes[g.inputs["in0"]].shape == (64, 64)  # the default batch size
    assert [g.nodes[i].shape for i in g.outputs.values()] == [(64, 10)]
    assert not g.frozen


def test_load_from_path_and_dynamic_batch(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "shapes.onnx"
    path.write_bytes(export(Shapes().eval(), (torch.randn(3, 64),), "torchscript", 17))
    for batch in (None, 1, 7):
        g = load_onnx(str(path), batch_size=batch).graph
        rows = 64 if batch is None else batch
        assert g.nodes[g.inputs["in0"]].shape == (rows, 64)
        assert [g.nodes[i].shape for i in g.outputs.values()] == [(rows, 64)] * 3
        x = np.random.default_rng(3).standard_normal((rows, 64))
        with torch.no_grad():
            want = Shapes()(torch.from_numpy(x))
        for got, w in zip(run_graph(g, {"in0": x})[0].values(), want):
            np.testing.assert_allclose(got, w.numpy(), rtol=1e-12)


@pytest.mark.skipif(not HAVE_ONNXSCRIPT, reason="the dynamo exporter needs onnxscript")
def test_dynamo_linear_on_3d_input_keeps_weights_trainable():
    """Optimized, the dynamo exporter folds W.T into `val_N`; unoptimized, it keeps
    Transpose(W). Both import as matmul(trans_b) of the trainable "0.weight"."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 4), nn.Tanh()).eval()
    x = torch.randn(3, 6, 8)
    xs = np.random.default_rng(4).standard_normal((BATCH, 6, 8))
    with torch.no_grad():
        want = copy.deepcopy(module).double()(torch.from_numpy(xs)).numpy()
    batch = torch.export.Dim("batch", min=2, max=1024)
    for optimize in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = torch.onnx.export(module, (x,), dynamo=True, opset_version=20, verbose=False,
                                     optimize=optimize, dynamic_shapes=({0: batch},))
        model = load_onnx(prog.model_proto, batch_size=BATCH)
        g = model.graph
        assert not g.frozen and set(model.params) == {"0.weight", "0.bias"}
        for k, v in model.params.items():
            np.testing.assert_array_equal(v, module.state_dict()[k].numpy())
        mm = [n for n in g.nodes if n.op == "matmul"]
        assert len(mm) == 1 and mm[0].attr("trans_b") and g.nodes[mm[0].inputs[1]].attr("name") == "0.weight"
        got = run_graph(g, {"input": xs})[0]
        np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-12, atol=1e-12)


def _single_node_model(node, inputs, outputs, initializers=(), opset=17):
    from onnx import helper
    graph = helper.make_graph([node], "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_unsupported_op_names_the_op():
    from onnx import TensorProto, helper
    node = helper.make_node("Hardmax", ["x"], ["y"], name="my_hardmax")
    proto = _single_node_model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    with pytest.raises(NotImplementedError, match="Hardmax") as err:
        load_onnx(proto.SerializeToString())
    assert "my_hardmax" in str(err.value) and "Gemm" in str(err.value)  # lists the supported ops


def test_second_dynamic_dimension_is_an_error():
    from onnx import TensorProto, helper
    node = helper.make_node("Relu", ["x"], ["y"])
    proto = _single_node_model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "m"])],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "m"])])
    with pytest.raises(ValueError, match="dimension 1 is dynamic"):
        load_onnx(proto)


def test_gemm_attributes_and_constant_folding():
    """Gemm with transA/alpha/beta and a broadcast C; a Reshape whose shape is computed
    from Shape/Gather/Concat; a Constant tensor becomes a frozen param."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 4)).astype(np.float32)  # used transposed: [4, 6]
    w = rng.standard_normal((6, 3)).astype(np.float32)
    c = rng.standard_normal((1, 3)).astype(np.float32)
    k = rng.standard_normal((3,)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w", "c"], ["g"], alpha=0.5, beta=2.0, transA=1),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(k)),
        helper.make_node("Add", ["g", "k"], ["h"]),
        helper.make_node("Shape", ["h"], ["s"]),
        helper.make_node("Constant", [], ["i0"], value=numpy_helper.from_array(np.array(0, np.int64))),
        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
        helper.make_node("Concat", ["n1", "tail"], ["shape"], axis=0),
        helper.make_node("Reshape", ["h", "shape"], ["r"]),
        helper.make_node("ReduceMean", ["r", "ax2"], ["m"], keepdims=0),
        helper.make_node("Sub", ["r", "one"], ["y0"]),
        helper.make_node("Squeeze", ["y0", "ax2"], ["y"]),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c"),
             numpy_helper.from_array(np.array([0], np.int64), "ax"),
             numpy_helper.from_array(np.array([3, 1], np.int64), "tail"),
             numpy_helper.from_array(np.array([2], np.int64), "ax2"),
             numpy_helper.from_array(np.array([1.0], np.float32), "one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3]),
                               helper.make_tensor_value_info("m", TensorProto.FLOAT, [4, 3])], inits)
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert set(model.params) == {"w", "c", "one", "const.k"}
    assert model.graph.frozen == {"const.k"}
    outs, _ = run_graph(model.graph, {"x": a.astype(np.float64)})
    h = 0.5 * a.T.astype(np.float64) @ w + 2.0 * c + k
    np.testing.assert_allclose(outs["y"], h - 1.0, rtol=1e-12)
    np.testing.assert_allclose(outs["m"], h, rtol=1e-12)


def test_reductions_without_axes_and_extra_ops():
    """noop_with_empty_axes, a reduction over all axes, ReduceMin, Clip, Min, Expand,
    Softmax over axis 0 and Pow with a constant exponent, at opset 18 (axes as inputs)."""
    from onnx import TensorProto, helper, numpy_helper
    c = numpy_helper.from_array
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["same"], noop_with_empty_axes=1),
        helper.make_node("ReduceMax", ["x"], ["all"], keepdims=0),
        helper.make_node("ReduceMin", ["x", "ax1"], ["rmin"]),
        helper.make_node("Clip", ["x", "lo", "hi"], ["clip"]),
        helper.make_node("Min", ["x", "rmin", "hi"], ["min3"]),
        helper.make_node("Expand", ["rmin", "shape"], ["wide"]),
        helper.make_node("Softmax", ["x"], ["sm"], axis=0),
        helper.make_node("Pow", ["x", "three"], ["cube"]),
    ]
    inits = [c(np.array([1], np.int64), "ax1"), c(np.array(-0.5, np.float32), "lo"),
             c(np.array(0.5, np.float32), "hi"), c(np.array([4, 3], np.int64), "shape")]
    consts = [helper.make_node("Constant", [], ["three"], value_float=3.0)]
    out = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
           for n in ("same", "all", "rmin", "clip", "min3", "wide", "sm", "cube")]
    graph = helper.make_graph(consts + nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                              out, inits)
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    # without torch.export metadata float initializers are weights: "hi" feeds Min as a tensor;
    # "lo" is only read as Clip's bound
    assert set(model.params) == {"hi"}
    x = np.random.default_rng(5).standard_normal((4, 3))
    got = run_graph(model.graph, {"x": x})[0]
    rmin = x.min(1, keepdims=True)
    e = np.exp(x - x.max(0))
    want = {"same": x, "all": x.max(), "rmin": rmin, "clip": np.clip(x, -0.5, 0.5),
            "min3": np.minimum(np.minimum(x, rmin), 0.5), "wide": np.broadcast_to(rmin, (4, 3)),
            "sm": e / e.sum(0), "cube": x ** 3}
    for k, w in want.items():
        assert got[k].shape == np.shape(w), k
        np.testing.assert_allclose(got[k], w, rtol=1e-12, err_msg=k)

"""ONNX import: torch modules exported with both exporters, run by the interpreter,
compared with torch (float64) on full tensors."""
import copy
import importlib.util
import io
import warnings

import numpy as np
import pytest

import torch  # noqa: E402  (the test extra installs it)
import onnx  # noqa: E402  (the test extra installs it)
import torch.nn.functional as F
from meganeura.compiler.ir.interpret import run_graph
from meganeura.compiler.onnx_import import load_onnx
from torch import nn

HAVE_ONNXSCRIPT = importlib.util.find_spec("onnxscript") is not None  # the test extra installs it
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
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], name="my_tfidf", mode="TF", min_gram_length=1,
                            max_gram_length=1, max_skip_count=0, ngram_counts=[0], ngram_indexes=[0],
                            pool_int64s=[1])
    proto = _single_node_model(node, [helper.make_tensor_value_info("x", TensorProto.INT32, ["n", 4])],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])])
    with pytest.raises(NotImplementedError, match="TfIdfVectorizer") as err:
        load_onnx(proto.SerializeToString())
    assert "my_tfidf" in str(err.value) and "Gemm" in str(err.value)  # lists the supported ops


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


# ------------------------------------------------------------------ layer ops
# Modules that export the ops of compiler/ir/ops_nn.py and ops_layers.py (TorchScript
# exporter, opsets 17 and 20); outputs compared with the float64 torch module.


class Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2)
        self.c2 = nn.Conv2d(6, 5, (3, 2), padding="same", bias=False)
        self.t = nn.ConvTranspose2d(5, 3, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):  # x: [B, 4, 9, 8]
        return self.t(self.c2(torch.relu(self.c1(x))))


class Convs1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv1d(3, 4, 3, stride=2, padding=2, dilation=2)
        self.t = nn.ConvTranspose1d(4, 2, 4, stride=3, padding=1, output_padding=2)

    def forward(self, x):  # x: [B, 3, 17]
        h = self.c(x)
        return self.t(h), F.max_pool1d(h, 3, 2, 1), F.avg_pool1d(h, 2)


class Pools(nn.Module):
    def forward(self, x):  # x: [B, 3, 11, 10]
        return (F.max_pool2d(x, 3, stride=2, padding=1, dilation=2, ceil_mode=True),
                F.max_pool2d(x, (2, 3)),
                F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
                F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=True),
                F.adaptive_avg_pool2d(x, 1))


class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(6)
        self.gn = nn.GroupNorm(3, 6)
        self.inorm = nn.InstanceNorm2d(6, affine=True)
        self.ln = nn.LayerNorm([5, 4])
        with torch.no_grad():
            for m in (self.bn, self.gn, self.inorm, self.ln):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):  # x: [B, 6, 5, 4]
        return self.bn(x), self.gn(x * 2 + 1), self.inorm(x), self.ln(x)


class Indexing(nn.Module):
    """Embedding (Gather of computed ids), constant indices on other axes, slices with
    steps and negative bounds, flip (a negative step)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, x, ids):  # x: [B, 6, 8], ids: [B, 3] int64
        e = self.emb(ids)  # [B, 3, 4]
        return (e * 2.0, x[:, 2], x[:, [0, 4, 1]], x[:, 1:6:2, -3:], torch.flip(x, [2]),
                x.index_select(2, torch.tensor([7, 5, 3])), x[..., 1])


class Plumbing(nn.Module):
    """Pad, Concat, Split, Where on float comparisons, Expand."""

    def forward(self, x, y):  # x: [B, 4, 6], y: [B, 4, 1]
        p = F.pad(x, (1, 2, 0, 1), value=0.5)
        a, b2, c = torch.split(x, [1, 2, 3], dim=2)
        q0, q1 = torch.chunk(x, 2, dim=1)
        w = torch.where(x > y, x, y * 2.0) + torch.where(x <= 0.3, 1.0, 0.0) + torch.where(x == y, x, 0.0)
        m = torch.where((x < 0.5) & ~(x > 1.0), x, -x)
        return (p, torch.cat([c, a, b2 * 2], 2), q1 - q0, w, m, y.expand(-1, 4, 6) + x,
                torch.cat([x, y.expand(-1, 4, 2)], -1))


class Interpolate(nn.Module):
    def forward(self, x):  # x: [B, 3, 5, 6]
        return (F.interpolate(x, scale_factor=2, mode="nearest"),
                F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=False),
                F.interpolate(x, size=(8, 4), mode="bilinear", align_corners=True),
                F.interpolate(x, scale_factor=(1.5, 2.0), mode="bicubic", align_corners=False),
                F.interpolate(x, size=(4, 11), mode="nearest"))


class Activations(nn.Module):
    def forward(self, x):  # x: [B, 32]
        return (F.softplus(x * 4), torch.sigmoid(x), F.hardsigmoid(x * 4), F.hardswish(x * 4),
                F.leaky_relu(x, 0.1), F.elu(x), F.selu(x), F.celu(x, 1.5), F.mish(x), F.silu(x),
                torch.erf(x), F.softsign(x), torch.clamp(x, -0.5, 0.7), torch.sign(x))


class Einsums(nn.Module):
    def forward(self, x, y):  # x: [B, 3, 4], y: [B, 4, 5]
        return (torch.einsum("bij,bjk->bik", x, y), torch.einsum("bij->bji", x),
                torch.einsum("bij,bjk->bk", x, y), torch.einsum("bij,bij->b", x, x))


class SinCos(nn.Module):
    """Positions computed in forward: Range, Sin, Cos fold at import."""

    def forward(self, x):  # x: [B, 8]
        pos = torch.arange(x.shape[1]).to(torch.float32) * 0.3
        return x * torch.sin(pos) + torch.cos(pos)


class BatchedMatMul(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 3))

    def forward(self, x, y):  # x: [B, 2, 4, 5], y: [B, 2, 5, 6]
        return x @ y, (x @ self.w).unsqueeze(1).squeeze(1)


LAYERS = {
    "convs": (Convs, [((4, 9, 8), "f")]),
    "convs1d": (Convs1d, [((3, 17), "f")]),
    "pools": (Pools, [((3, 11, 10), "f")]),
    "norms": (Norms, [((6, 5, 4), "f")]),
    "indexing": (Indexing, [((6, 8), "f"), ((3,), "i")]),
    "plumbing": (Plumbing, [((4, 6), "f"), ((4, 1), "f")]),
    "interpolate": (Interpolate, [((3, 5, 6), "f")]),
    "activations": (Activations, [((32,), "f")]),
    "einsum": (Einsums, [((3, 4), "f"), ((4, 5), "f")]),
    "sincos": (SinCos, [((8,), "f")]),
    "batched_matmul": (BatchedMatMul, [((2, 4, 5), "f"), ((2, 5, 6), "f")]),
}
LAYER_CASES = [(name, opset) for name in LAYERS for opset in (17, 20)]
GPU_LAYERS = ("convs", "pools", "norms", "indexing", "plumbing", "interpolate")


def _export_layers(name, opset, constant_folding=True):
    factory, specs = LAYERS[name]
    torch.manual_seed(0)
    module = factory().eval()
    args = tuple(torch.from_numpy(a) for a in make_inputs(specs, 3, seed=1))
    names = [f"in{i}" for i in range(len(args))]
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, f, dynamo=False, opset_version=opset, input_names=names,
                          dynamic_axes={n: {0: "batch"} for n in names}, do_constant_folding=constant_folding)
    return module, specs, f.getvalue()


def _torch_outputs(module, inputs):
    ref64 = copy.deepcopy(module).double()
    with torch.no_grad():
        want = ref64(*(torch.from_numpy(a.astype(np.float64) if a.dtype.kind == "f" else a) for a in inputs))
    return [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]


def _close(got, want, tol):
    assert len(got) == len(want)
    for i, (a, w) in enumerate(zip(got, want)):
        assert a.shape == w.shape, f"output {i}: {a.shape} vs {w.shape}"
        np.testing.assert_allclose(a, w, rtol=tol, atol=tol * max(1.0, np.abs(w).max()), err_msg=f"output {i}")


@pytest.mark.parametrize("name,opset", LAYER_CASES, ids=[f"{n}-{o}" for n, o in LAYER_CASES])
def test_layer_ops_match_torch(name, opset):
    module, specs, data = _export_layers(name, opset, constant_folding=name != "sincos")
    model = load_onnx(data, batch_size=BATCH)
    g = model.graph
    inputs = make_inputs(specs, BATCH, seed=2)
    if name == "indexing":
        assert any(n.op == "gather" for n in g.nodes) and any(n.op == "slice" for n in g.nodes)
    outs, _ = run_graph(g, dict(zip(g.inputs, inputs)), np.float64)
    _close(list(outs.values()), _torch_outputs(module, inputs), 1e-6)


@pytest.mark.parametrize("name", GPU_LAYERS)
def test_layer_ops_on_gpu(name, device):
    from meganeura.compiler import compile_model
    from meganeura.runtime import Package, Session

    module, specs, data = _export_layers(name, 17)
    model = load_onnx(data, batch_size=BATCH)
    inputs = make_inputs(specs, BATCH, seed=2)
    session = Session(device, Package.from_bytes(compile_model(model)))
    got = session.run("infer", dict(zip(model.graph.inputs, inputs)))
    _close([got[k] for k in model.graph.outputs], _torch_outputs(module, inputs), 1e-4)


# ------------------------------------------------ hand-built graphs: what torch never writes
def _graph_model(nodes, inputs, outputs, inits=(), opset=17):
    from onnx import TensorProto, helper

    def vi(name, shape, t=TensorProto.FLOAT):
        return helper.make_tensor_value_info(name, t, shape)

    graph = helper.make_graph(nodes, "g", [vi(*i) for i in inputs], [vi(o, None) for o in outputs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_conv_auto_pad_and_conv_transpose_output_shape():
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(6)
    x2, w2 = rng.standard_normal((2, 3, 7, 8)), rng.standard_normal((4, 3, 3, 2))
    x1, w1 = rng.standard_normal((2, 3, 10)), rng.standard_normal((4, 3, 4))
    wt = rng.standard_normal((3, 2, 3, 3))
    nodes = [helper.make_node("Conv", ["x2", "w2"], ["upper"], auto_pad="SAME_UPPER", strides=[2, 3]),
             helper.make_node("Conv", ["x2", "w2"], ["lower"], auto_pad="SAME_LOWER", dilations=[2, 1]),
             helper.make_node("Conv", ["x2", "w2"], ["valid"], auto_pad="VALID", strides=[1, 2]),
             helper.make_node("Conv", ["x1", "w1"], ["c1"], auto_pad="SAME_UPPER", strides=[3]),
             helper.make_node("ConvTranspose", ["x2", "wt"], ["t"], strides=[2, 2], output_shape=[14, 17])]
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (("w2", w2), ("w1", w1), ("wt", wt))]
    model = load_onnx(_graph_model(nodes, [("x2", [2, 3, 7, 8]), ("x1", [2, 3, 10])],
                                   ["upper", "lower", "valid", "c1", "t"], inits))
    w2, w1, wt = (model.params[k].astype(np.float64) for k in ("w2", "w1", "wt"))
    got = run_graph(model.graph, {"x2": x2, "x1": x1})[0]
    T = torch.from_numpy
    # SAME: the output is ceil(in / stride); the odd padding goes last (UPPER) or first (LOWER)
    want = {"upper": F.conv2d(F.pad(T(x2), (0, 0, 1, 1)), T(w2), stride=(2, 3)),  # H pads 1+1, W 0+0
            "lower": F.conv2d(F.pad(T(x2), (1, 0, 2, 2)), T(w2), dilation=(2, 1)),  # W pads 1+0
            "valid": F.conv2d(T(x2), T(w2), stride=(1, 2)),
            "c1": F.conv1d(F.pad(T(x1), (1, 2)), T(w1), stride=3),
            # output_shape [14, 17] of a full [15, 17]: the odd row is cut at the start
            "t": F.conv_transpose2d(T(x2), T(wt), stride=2)[..., 1:, :]}
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w.numpy(), rtol=1e-12, atol=1e-12, err_msg=k)


def test_slice_split_gather_hand_built():
    """Slice with negative steps and out-of-range bounds; Split by num_outputs (opset 18,
    uneven) and by sizes; Gather on axis 1 by a computed index tensor; Pad with axes."""
    from onnx import TensorProto, helper, numpy_helper
    c = numpy_helper.from_array
    i64 = lambda v: np.array(v, np.int64)
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"]),
             helper.make_node("Split", ["x"], ["p0", "p1", "p2"], axis=2, num_outputs=3),
             helper.make_node("Split", ["x", "sizes"], ["q0", "q1"], axis=1),
             helper.make_node("Gather", ["x", "idx"], ["g"], axis=1),
             helper.make_node("Gather", ["x", "cidx"], ["gc"], axis=-1),
             helper.make_node("Pad", ["x", "pads", "pv", "pax"], ["pd"])]
    inits = [c(i64([100, -1, 1]), "st"), c(i64([-100, 0, 9]), "en"), c(i64([2, 0, 1]), "ax"),
             c(i64([-2, -1, 2]), "sp"), c(i64([1, 3]), "sizes"), c(i64([[3, 0], [1, -1]]), "cidx"),
             c(i64([1, -1, 2, 0]), "pads"), c(np.array(2.5, np.float32), "pv"), c(i64([1, 2]), "pax")]
    from onnx import helper as h
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 7]),
                                      h.make_tensor_value_info("idx", TensorProto.INT64, [2, 3])],
                         [h.make_tensor_value_info(n, TensorProto.FLOAT, None)
                          for n in ("s", "p0", "p1", "p2", "q0", "q1", "g", "gc", "pd")], inits)
    model = load_onnx(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]))
    x = np.random.default_rng(7).standard_normal((3, 4, 7))
    idx = np.array([[3, 0, 1], [2, 2, -4]])
    got = run_graph(model.graph, {"x": x, "idx": idx})[0]
    want = {"s": x[-1:0:-1, 1:9:2, 100:-100:-2], "p0": x[..., :3], "p1": x[..., 3:6], "p2": x[..., 6:],
            "q0": x[:, :1], "q1": x[:, 1:], "g": np.take(x, idx % 4, axis=1),
            "gc": np.take(x, np.array([[3, 0], [1, 6]]), axis=2),
            "pd": np.pad(x[:, :, 1:], ((0, 0), (1, 2), (0, 0)), constant_values=2.5)}
    for k, w in want.items():
        assert got[k].shape == w.shape, k
        np.testing.assert_array_equal(got[k], w, err_msg=k)
    ops = {n.op for n in model.graph.nodes}
    assert {"slice", "gather", "transpose", "pad"} <= ops


def test_group_normalization_opsets():
    """GroupNormalization scales per group before opset 21, per channel from 21."""
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 6, 3, 2))
    for opset, n in ((18, 3), (21, 6)):
        s, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, epsilon=1e-3)
        model = load_onnx(_graph_model([node], [("x", [2, 6, 3, 2])], ["y"],
                                       [numpy_helper.from_array(s, "s"), numpy_helper.from_array(b, "b")], opset))
        got = run_graph(model.graph, {"x": x})[0]["y"]
        per = np.repeat if opset == 18 else (lambda a, k: a)
        sc, bc = per(s.astype(np.float64), 2), per(b.astype(np.float64), 2)
        want = F.group_norm(torch.from_numpy(x), 3, torch.from_numpy(sc), torch.from_numpy(bc), eps=1e-3)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-7, atol=1e-9)  # epsilon is a float32


def test_unsupported_modes_raise_not_implemented():
    """Variants the importer refuses say what they are (MaxPool's indices over three axes,
    Resize of an axis besides the last two in a mode that needs them)."""
    from onnx import helper
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2, 2])
    with pytest.raises(NotImplementedError, match="Indices"):
        load_onnx(_graph_model([node], [("x", [1, 1, 4, 4, 4])], ["y", "i"]))
    node = helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[2, 2], ceil_mode=1)
    with pytest.raises(NotImplementedError, match="ceil_mode"):
        load_onnx(_graph_model([node], [("x", [1, 1, 5, 5])], ["y"]))

"""ONNX index and spatial ops (GatherElements, GatherND, ScatterElements, ScatterND, Trilu,
CumSum, OneHot, Hardmax, GridSample, AffineGrid, Col2Im, 3-D Conv / ConvTranspose / pools):
one-node models imported, differentiated with respect to their float inputs, and compared
on full tensors with torch autograd in float64 (the interpreter, 1e-9) and, for some, the
GPU (1e-4); a small 3-D model's training step against torch's SGD."""
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from meganeura.compiler import Builder, run_graph
from meganeura.compiler.ir.autodiff import gradients
from meganeura.compiler.onnx_import import load_onnx
from onnx import TensorProto, helper, numpy_helper


def _model(op, feed, attrs, consts=(), opset=20):
    """A one-node model: inputs named as `feed` (float32, or int64 for integer arrays),
    constants as initializers, one output 'y'."""
    inputs = [helper.make_tensor_value_info(k, TensorProto.INT64 if v.dtype.kind in "iu" else TensorProto.FLOAT,
                                            v.shape) for k, v in feed.items()]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(consts).items()]
    names = list(feed) + [k for k, _ in consts]
    order = attrs.pop("_order", names)
    node = helper.make_node(op, order, ["y"], **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _graph_with_grads(model, feed):
    """(graph with outputs y and grad_<input> of sum(y * ct), inputs with ct, float input names)."""
    m = load_onnx(model)
    b = Builder.extend(m)
    y = b.outputs["y"]
    wrt = [k for k, v in feed.items() if v.dtype.kind == "f"]
    ids = [b.g.named[("input", k)] for k in wrt]
    ct = b.input("ct", y.shape)
    grads = gradients(b.e, b.sum(y * ct).id, ids)
    for k, i in zip(wrt, ids):
        if i in grads:  # (no gradient: the output is piecewise constant in that input)
            b.g.outputs[f"grad_{k}"] = grads[i]
    rng = np.random.default_rng(len(feed) + int(np.prod(y.shape)))
    vals = {**feed, "ct": rng.standard_normal(y.shape).astype(np.float32).astype(np.float64)}
    return b.g, vals, wrt


def _torch(fn, feed, ct, wrt):
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=k in wrt) if v.dtype.kind == "f"
         else torch.tensor(v.astype(np.int64)) for k, v in feed.items()}
    y = fn(**t)
    grads = torch.autograd.grad((y * torch.tensor(ct)).sum(), [t[k] for k in wrt])
    return {"y": y.detach().numpy(), **{f"grad_{k}": g.numpy() for k, g in zip(wrt, grads)}}


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _f(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32).astype(np.float64)


def _check(model, feed, fn, run_on_gpu=None):
    g, vals, wrt = _graph_with_grads(model, feed)
    ref = _torch(fn, feed, vals["ct"], wrt)
    got = run_graph(g, vals, np.float64)[0]
    for k in set(ref) - set(got):
        assert not ref[k].any(), f"{k}: no gradient, torch's is not zero"
        del ref[k]
    assert set(got) == set(ref)
    for k in ref:
        assert _rel(got[k], ref[k]) < 1e-9, f"{k}: interpreter vs torch"
    if run_on_gpu is not None:
        gpu = run_on_gpu(g, vals)
        for k in ref:
            assert _rel(gpu[k], ref[k]) < 1e-4, f"{k}: GPU vs torch"


R = np.random.default_rng(31)
X46 = _f(R, 4, 6)
IDX43 = np.array([[5, 0, -1], [2, 2, 3], [-6, 4, 1], [0, 5, 5]])
UNIQUE43 = np.array([[5, 0, 1], [2, 4, 3], [0, 4, 1], [3, 5, 2]])
U43 = _f(R, 4, 3)
U43[1, 0] = 0.0  # a single zero in its row (ScatterElements mul)
TORCH_REDUCE = {"mul": "prod", "max": "amax", "min": "amin"}


def _scatter_t(red):
    def fn(data, indices, updates):
        idx = indices % 6
        if red == "none":
            return data.scatter(1, idx, updates)
        if red == "add":
            return data.scatter_add(1, idx, updates)
        return data.scatter_reduce(1, idx, updates, TORCH_REDUCE[red], include_self=True)
    return fn


@pytest.mark.parametrize("red", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_against_torch(red, run_on_gpu):
    feed = {"data": X46, "indices": UNIQUE43 if red == "none" else IDX43, "updates": U43}
    model = _model("ScatterElements", feed, {"axis": 1, "reduction": red})
    _check(model, feed, _scatter_t(red), run_on_gpu if red in ("mul", "max") else None)


def test_gather_elements_runtime_and_constant_indices(run_on_gpu):
    feed = {"data": X46, "indices": IDX43}
    _check(_model("GatherElements", feed, {"axis": 1}), feed,
           lambda data, indices: torch.gather(data, 1, indices % 6), run_on_gpu)
    idx0 = np.array([[3, -1, 0, 2, 1, 0]])
    _check(_model("GatherElements", {"data": X46}, {"axis": 0, "_order": ["data", "i"]}, [("i", idx0)]),
           {"data": X46}, lambda data: torch.gather(data, 0, torch.tensor(idx0 % 4)))


def test_gather_nd_and_scatter_nd_against_torch(run_on_gpu):
    data = _f(R, 2, 3, 4, 5)
    idx = np.array([[[0, 1], [2, -1], [1, 1]], [[-3, 0], [2, 3], [0, 0]]])  # [2, 3, 2], batch_dims 1
    feed = {"data": data, "indices": idx}
    _check(_model("GatherND", feed, {"batch_dims": 1}), feed,
           lambda data, indices: data[torch.arange(2)[:, None], indices[..., 0], indices[..., 1]])
    idx = np.array([[[1, 0], [4, 2]], [[-5, 2], [3, 3]]])  # [2, 2, 2] into [5, 4, 3]: rows (1, 0), (4, 2) ...
    data, upd = _f(R, 5, 4, 3), _f(R, 2, 2, 3)
    rows = torch.tensor((idx[..., 0] % 5) * 4 + idx[..., 1]).reshape(-1, 1).expand(-1, 3)
    for red in ("add", "max"):
        feed = {"data": data, "indices": idx, "updates": upd}

        def fn(data, indices, updates, red=red):
            flat, u = data.reshape(20, 3), updates.reshape(4, 3)
            out = flat.scatter_add(0, rows, u) if red == "add" else flat.scatter_reduce(0, rows, u, "amax")
            return out.reshape(5, 4, 3)
        _check(_model("ScatterND", feed, {"reduction": red}), feed, fn, run_on_gpu if red == "add" else None)


def test_trilu_cumsum_onehot_against_torch():
    x = _f(R, 2, 4, 5)
    for upper, k in ((1, -1), (0, 2), (1, 4)):
        _check(_model("Trilu", {"x": x}, {"upper": upper, "_order": ["x", "k"]}, [("k", np.array(k))]), {"x": x},
               lambda x, upper=upper, k=k: torch.triu(x, k) if upper else torch.tril(x, k))
    for exclusive in (0, 1):
        for reverse in (0, 1):
            def fn(x, e=exclusive, r=reverse):
                y = x.flip(1).cumsum(1).flip(1) if r else x.cumsum(1)
                return y - x if e else y
            _check(_model("CumSum", {"x": x}, {"exclusive": exclusive, "reverse": reverse, "_order": ["x", "axis"]},
                          [("axis", np.array(-2))]), {"x": x}, fn)
    idx = np.array([[1, -1, 7], [0, 2, -4]])  # 7: outside the depth, all off; -4: 0
    feed = {"indices": idx, "values": np.array([-0.5, 2.0])}
    _check(_model("OneHot", feed, {"axis": 1, "_order": ["indices", "depth", "values"]}, [("depth", np.array(4.0))]),
           feed, lambda indices, values: torch.where(
               torch.where(indices < 0, indices + 4, indices)[:, None, :] == torch.arange(4)[None, :, None],
               values[1], values[0]))


def test_hardmax_marks_the_first_maximum():
    x = np.array([[[1, 3, 3, 0], [2, 2, 1, -1], [0, 0, 0, 0]], [[5, 1, 5, 2], [0, 1, 2, 3], [7, 7, -7, 7]]], float)
    for axis in (1, 2):
        g = load_onnx(_model("Hardmax", {"x": x}, {"axis": axis}, opset=13)).graph
        got = run_graph(g, {"x": x}, np.float64)[0]["y"]
        want = np.moveaxis(np.eye(x.shape[axis])[np.argmax(x, axis=axis)], -1, axis)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode,pad,align", [
    ("bilinear", "zeros", 0), ("bilinear", "border", 1), ("bilinear", "reflection", 0), ("bilinear", "reflection", 1),
    ("nearest", "zeros", 0), ("nearest", "border", 0), ("bicubic", "zeros", 0)])
def test_grid_sample_against_torch(mode, pad, align, run_on_gpu):
    rng = np.random.default_rng(zlib.crc32(f"{mode}{pad}{align}".encode()))
    feed = {"X": _f(rng, 2, 3, 5, 6), "Grid": rng.uniform(-1.6, 1.6, (2, 4, 7, 2)).astype(np.float32).astype(float)}
    model = _model("GridSample", feed, {"mode": mode, "padding_mode": pad, "align_corners": align}, opset=16)
    _check(model, feed, lambda X, Grid: F.grid_sample(X, Grid, mode, pad, bool(align)),
           run_on_gpu if (mode, pad, align) == ("bilinear", "reflection", 0) else None)


@pytest.mark.filterwarnings("ignore:Since version 1.3.0")  # torch on a unit-size grid: 0, as here
def test_grid_sample_volumetric_and_affine_grid_against_torch():
    feed = {"X": _f(R, 1, 2, 3, 4, 5), "Grid": R.uniform(-1.2, 1.2, (1, 2, 3, 4, 3))}
    _check(_model("GridSample", feed, {"mode": "linear", "padding_mode": "border"}), feed,
           lambda X, Grid: F.grid_sample(X, Grid, "bilinear", "border", False))
    for size, align in (((2, 3, 4, 5), 0), ((2, 3, 4, 1), 1), ((2, 1, 3, 4, 2), 0)):
        feed = {"theta": _f(R, 2, len(size) - 2, len(size) - 1)}
        _check(_model("AffineGrid", feed, {"align_corners": align, "_order": ["theta", "size"]},
                      [("size", np.array(size))]), feed,
               lambda theta, size=size, align=align: F.affine_grid(theta, list(size), bool(align)))


def test_col2im_against_torch(run_on_gpu):
    feed = {"x": _f(R, 2, 3 * 2 * 3, 9)}  # 3 channels, 2x3 blocks, 3x3 block positions
    at = {"dilations": [1, 2], "pads": [1, 0, 1, 0], "strides": [2, 1], "_order": ["x", "image", "block"]}
    model = _model("Col2Im", feed, at, [("image", np.array([5, 7])), ("block", np.array([2, 3]))])
    _check(model, feed, lambda x: F.fold(x, (5, 7), (2, 3), dilation=(1, 2), padding=(1, 0), stride=(2, 1)),
           run_on_gpu)


def test_conv3d_and_conv_transpose3d_against_torch(run_on_gpu):
    feed = {"x": _f(R, 2, 4, 5, 6, 5), "w": _f(R, 6, 2, 3, 2, 3), "b": _f(R, 6)}
    at = {"strides": [2, 1, 2], "pads": [1, 0, 1, 1, 0, 1], "dilations": [1, 2, 1], "group": 2}
    _check(_model("Conv", feed, at), feed,
           lambda x, w, b: F.conv3d(x, w, b, stride=(2, 1, 2), padding=(1, 0, 1), dilation=(1, 2, 1), groups=2),
           run_on_gpu)
    feed = {"x": _f(R, 2, 4, 3, 4, 3), "w": _f(R, 4, 3, 3, 2, 3), "b": _f(R, 6)}
    at = {"strides": [2, 1, 2], "pads": [1, 0, 1, 1, 0, 1], "output_padding": [1, 0, 1], "group": 2,
          "dilations": [1, 2, 1]}
    _check(_model("ConvTranspose", feed, at), feed,
           lambda x, w, b: F.conv_transpose3d(x, w, b, stride=(2, 1, 2), padding=(1, 0, 1), output_padding=(1, 0, 1),
                                              groups=2, dilation=(1, 2, 1)), run_on_gpu)


def test_pools3d_against_torch(run_on_gpu):
    feed = {"x": _f(R, 2, 3, 7, 6, 5)}
    at = {"kernel_shape": [3, 2, 3], "strides": [2, 2, 1], "pads": [1, 0, 1, 1, 0, 1], "ceil_mode": 1}
    _check(_model("MaxPool", feed, {**at, "dilations": [1, 2, 1]}), feed,
           lambda x: F.max_pool3d(x, (3, 2, 3), (2, 2, 1), (1, 0, 1), dilation=(1, 2, 1), ceil_mode=True), run_on_gpu)
    for include in (0, 1):
        _check(_model("AveragePool", feed, {**at, "count_include_pad": include}), feed,
               lambda x, include=include: F.avg_pool3d(x, (3, 2, 3), (2, 2, 1), (1, 0, 1), ceil_mode=True,
                                                       count_include_pad=bool(include)),
               run_on_gpu if include else None)


class Spatial3d(torch.nn.Module):
    """Conv3d, MaxPool3d, a grid sample at learned positions, a gather and a linear head."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.conv = torch.nn.Conv3d(2, 3, 3, padding=1)
        self.grid = torch.nn.Parameter(torch.rand(2, 3, 4, 2, generator=g) * 2.4 - 1.2)
        self.fc = torch.nn.Linear(6 * 3 * 4, 4)
        self.register_buffer("order", torch.tensor([[[[3, 0, 1, 1]]]]))

    def forward(self, x):  # [2, 2, 4, 6, 6]
        h = F.max_pool3d(torch.relu(self.conv(x)), 2).flatten(1, 2)  # [2, 6, 3, 3]
        s = F.grid_sample(h, self.grid, "bilinear", "reflection", align_corners=False)  # [2, 6, 3, 4]
        s = torch.gather(s, 3, self.order.expand(2, 6, 3, 4))
        return self.fc(s.flatten(1))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter
def test_training_step_matches_torch_sgd(device):
    """One SGD step of a compiled training package on the GPU against torch's."""
    import io

    from meganeura.compiler import TrainConfig, compile_model
    from meganeura.runtime import Package, Session

    torch.manual_seed(0)
    module = Spatial3d()
    x = torch.randn(2, 2, 4, 6, 6)
    labels = torch.randn(2, 4)
    buf = io.BytesIO()
    torch.onnx.export(module, (x,), buf, input_names=["x"], output_names=["y"], opset_version=17, dynamo=False)
    model = load_onnx(buf.getvalue(), batch_size=2)
    before = {k: np.asarray(v, np.float64) for k, v in model.params.items()}
    pkg = compile_model(model, TrainConfig(loss="mse", optimizer="sgd", lr=0.5, momentum=0.0))
    session = Session(device, Package.from_bytes(pkg))
    loss = session.run("train_step", {"x": x.numpy(), "labels": labels.numpy()})["loss"]
    tloss = F.mse_loss(module(x), labels)
    tloss.backward()
    assert abs(float(loss) - tloss.item()) < 1e-5 * max(1.0, tloss.item())
    after = session.weights()
    for name, p in module.named_parameters():
        step = after[name] - before[name]
        assert _rel(step, -0.5 * p.grad.numpy()) < 1e-3, name


def test_long_cumsum_runs_as_a_scan(run_on_gpu):
    x = _f(R, 3, 600)
    for exclusive, reverse in ((0, 0), (1, 1)):
        model = _model("CumSum", {"x": x}, {"exclusive": exclusive, "reverse": reverse, "_order": ["x", "axis"]},
                       [("axis", np.array(1))])
        assert not any(n.op == "matmul" for n in load_onnx(model).graph.nodes)

        def fn(x, e=exclusive, r=reverse):
            y = x.flip(1).cumsum(1).flip(1) if r else x.cumsum(1)
            return y - x if e else y
        _check(model, {"x": x}, fn, run_on_gpu)

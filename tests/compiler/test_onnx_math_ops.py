"""ONNX elementary functions (Sin ... Atanh, Round), Pow with a tensor exponent, Mod of
floats, Det, CumProd, BitCast, SwiGLU, BatchNormalization in training mode and the
ai.onnx.preview.training updates (Momentum, Adam, Adagrad).

Hand-built models imported; outputs and the gradients of sum(output * ct) compared on full
tensors with torch autograd in float64 (the interpreter, 1e-9) and the GPU (1e-4); the GPU's
elementary functions element by element over their whole domains; remainders, integer
powers, bit casts and integer running products bit for bit against numpy; the training
updates against onnx's reference evaluator."""
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from meganeura.compiler import compile_graph, run_graph
from meganeura.compiler.onnx_import import load_onnx
from meganeura.runtime import Package, Session
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from test_onnx_seq_ops import with_gradients

TRAINING = "ai.onnx.preview.training"


def _vi(name, v):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.shape(v))


def _model(nodes, feed: dict, outputs: dict, inits=(), opset=26, domains=()):
    """Graph inputs as `feed`'s arrays (their dtypes), outputs name -> ONNX element type."""
    g = helper.make_graph(nodes, "g", [_vi(k, v) for k, v in feed.items()],
                          [helper.make_tensor_value_info(k, t, None) for k, t in outputs.items()],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(g, opset_imports=ops)


def _run(device, model, feed):
    session = Session(device, Package.from_bytes(compile_graph(model.graph)))
    return session.run("infer", feed, check_finite=False)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _check_grads(device, proto, feed, torch_fn):
    """Outputs and gradients (w.r.t. every float input) against torch: interpreter 1e-9, GPU 1e-4."""
    model = load_onnx(proto)
    rng = np.random.default_rng(11)
    wrt = [k for k, v in feed.items() if v.dtype.kind == "f"]
    tins = {k: torch.tensor(v.astype(np.float64), requires_grad=k in wrt) if v.dtype.kind == "f"
            else torch.tensor(v.astype(np.int64)) for k, v in feed.items()}
    touts = torch_fn(**tins)
    touts = touts if isinstance(touts, tuple) else (touts,)
    cts = [rng.standard_normal(tuple(t.shape)) for t in touts]
    sum((t * torch.tensor(c)).sum() for t, c in zip(touts, cts)).backward()
    names = list(model.graph.outputs)
    want = {k: t.detach().numpy() for k, t in zip(names, touts)}
    want.update({f"grad.{k}": tins[k].grad.numpy() for k in wrt})
    g = with_gradients(model, {k: c.shape for k, c in zip(names, cts)}, wrt)
    vals = {**{k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in feed.items()},
            **{f"ct.{k}": c for k, c in zip(names, cts)}}
    got = run_graph(g, vals)[0]
    gpu = Session(device, Package.from_bytes(compile_graph(g))).run(
        "infer", {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in vals.items()})
    for k, w in want.items():
        assert _rel(got[k], w) < 1e-9, f"{k}: interpreter vs torch {_rel(got[k], w):.3g}"
        assert _rel(gpu[k], w) < 1e-4, f"{k}: GPU vs torch {_rel(gpu[k], w):.3g}"


def _signed_logspace(lo, hi, n=300):
    v = np.logspace(lo, hi, n)
    return np.concatenate([v, -v])


# ONNX op -> (numpy, inputs over the domain, relative tolerance per element)
ELEMENTARY = {
    "Sin": (np.sin, _signed_logspace(-6, np.log10(6)), 1e-6),
    "Cos": (np.cos, _signed_logspace(-6, np.log10(6)), 1e-6),
    "Tan": (np.tan, _signed_logspace(-6, np.log10(1.5)), 1e-6),
    "Sinh": (np.sinh, _signed_logspace(-6, np.log10(89)), 8e-6),  # exp's own error grows with its argument
    "Cosh": (np.cosh, _signed_logspace(-6, np.log10(89)), 8e-6),
    "Asin": (np.arcsin, np.clip(_signed_logspace(-6, 0), -1, 1), 1e-6),
    "Acos": (np.arccos, np.clip(_signed_logspace(-6, 0), -1, 1), 1e-6),
    "Atan": (np.arctan, _signed_logspace(-6, 30), 1e-6),
    "Asinh": (np.arcsinh, _signed_logspace(-6, 30), 1e-6),
    "Acosh": (np.arccosh, 1 + np.logspace(-6, 30, 300), 1e-6),
    "Atanh": (np.arctanh, np.clip(_signed_logspace(-6, np.log10(0.99999)), -1, 1), 1e-6),
}


def test_elementary_functions_over_their_domains(device):
    """Every element within a few units in the last place, from 1e-6 to the edge of the
    domain (1e30, overflow, or +-1): no cancellation near 0, no overflow before the result's."""
    feed = {f"x{op}": f[1].astype(np.float32) for op, f in ELEMENTARY.items()}
    nodes = [helper.make_node(op, [f"x{op}"], [f"y{op}"]) for op in ELEMENTARY]
    model = load_onnx(_model(nodes, feed, {f"y{op}": TensorProto.FLOAT for op in ELEMENTARY}))
    got = _run(device, model, feed)
    ref = run_graph(model.graph, feed, np.float64)[0]
    for op, (fn, _, tol) in ELEMENTARY.items():
        want = fn(feed[f"x{op}"].astype(np.float64))
        np.testing.assert_allclose(ref[f"y{op}"], want, rtol=1e-12, err_msg=f"{op}: interpreter")
        np.testing.assert_allclose(got[f"y{op}"], want, rtol=tol, atol=0, err_msg=f"{op}: GPU")


def test_elementary_function_gradients(device):
    x = np.linspace(-0.9, 0.9, 12).astype(np.float32).reshape(3, 4)
    ops = {"Sin": torch.sin, "Cos": torch.cos, "Tan": torch.tan, "Sinh": torch.sinh, "Cosh": torch.cosh,
           "Asin": torch.asin, "Acos": torch.acos, "Atan": torch.atan, "Asinh": torch.asinh, "Atanh": torch.atanh}
    nodes = [helper.make_node(op, ["x"], [f"y{op}"]) for op in ops] + [helper.make_node("Acosh", ["z"], ["yAcosh"])]
    feed = {"x": x, "z": (x + 2.0).astype(np.float32)}
    outs = {f"y{op}": TensorProto.FLOAT for op in list(ops) + ["Acosh"]}
    _check_grads(device, _model(nodes, feed, outs), feed,
                 lambda x, z: tuple(fn(x) for fn in ops.values()) + (torch.acosh(z),))


def test_round_halves_to_even(device):
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, -0.49999997, 4194304.5, 8388607.5, 3e9, 2.7],
                 np.float32)
    got = _run(device, load_onnx(_model([helper.make_node("Round", ["x"], ["y"])], {"x": x},
                                        {"y": TensorProto.FLOAT})), {"x": x})["y"]
    np.testing.assert_array_equal(got, np.round(x))


# --------------------------------------------------------------------- Pow
def test_pow_tensor_exponents(device):
    """Negative bases with whole exponents (signs exact), integer powers wrapping as int32,
    an integer base to a float power truncated as numpy's astype."""
    xf = np.array([-2.0, -1.5, 0.5, 3.0, -3.0, 0.0, 2.0, -0.75], np.float32)
    yi = np.array([3, 2, -2, 4, 5, 0, 30, -3], np.int64)
    xi = np.array([2, -3, 7, 1, -1, 0, 5, 3], np.int32)
    ni = np.array([31, 3, 20, -4, -3, 0, -1, 13], np.int32)
    yf = np.array([0.5, 3.0, 1.5, 2.0, 2.0, 2.0, 2.0, 2.2], np.float32)
    nodes = [helper.make_node("Pow", ["xf", "yi"], ["a"]), helper.make_node("Pow", ["xi", "ni"], ["b"]),
             helper.make_node("Pow", ["xi", "yf"], ["c"])]
    feed = {"xf": xf, "yi": yi, "xi": xi, "ni": ni, "yf": yf}
    model = load_onnx(_model(nodes, feed, {"a": TensorProto.FLOAT, "b": TensorProto.INT32, "c": TensorProto.INT32}))
    got = _run(device, model, feed)
    np.testing.assert_allclose(got["a"], np.power(xf.astype(np.float64), yi), rtol=1e-6)
    wrapped = [(pow(int(a), int(n), 1 << 32) + (1 << 31)) % (1 << 32) - (1 << 31) if n >= 0 else
               (1 if a == 1 else (-1) ** abs(int(n)) if a == -1 else 0) for a, n in zip(xi, ni)]
    np.testing.assert_array_equal(got["b"], np.array(wrapped, np.int32))
    np.testing.assert_array_equal(got["c"], np.power(xi.astype(np.float64), yf).astype(np.int32))


def test_pow_gradients_broadcast(device):
    rng = np.random.default_rng(3)
    feed = {"x": rng.uniform(0.3, 2.5, (3, 4)).astype(np.float32), "y": rng.standard_normal((1, 4)).astype(np.float32)}
    _check_grads(device, _model([helper.make_node("Pow", ["x", "y"], ["z"])], feed, {"z": TensorProto.FLOAT}),
                 feed, lambda x, y: torch.pow(x, y))


# --------------------------------------------------------------------- Mod
HARD_X = [1e30, -1e30, 16777217.0, 3.0e9, -4.3, 7.2, 0.0, -0.0, -3.0, 3.0, -1.0, 1.0, np.inf, 1.0, np.nan, 1.0,
          123456.79, 1e-30, 5.0, -8.0]
HARD_Y = [3.1, 0.1, 0.3, -7.7, 2.1, -3.4, -2.0, 2.0, np.inf, np.inf, -np.inf, -np.inf, 2.0, 0.0, 2.0, np.nan,
          -1e-3, 3e-31, 8.0, 5.0]


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_of_floats_is_exact(device, fmod):
    """numpy's remainder (fmod=0) and C's fmod (fmod=1) bit for bit in float32, also where
    x - y * floor(x / y) or trunc would be far off (quotients past 2^24)."""
    rng = np.random.default_rng(5)
    x = np.concatenate([HARD_X, rng.standard_normal(40) * 10.0 ** rng.integers(-3, 12, 40)]).astype(np.float32)
    y = np.concatenate([HARD_Y, rng.standard_normal(40) * 10.0 ** rng.integers(-3, 3, 40)]).astype(np.float32)
    feed = {"x": x, "y": y}
    model = load_onnx(_model([helper.make_node("Mod", ["x", "y"], ["z"], fmod=fmod)], feed, {"z": TensorProto.FLOAT}))
    with np.errstate(all="ignore"):
        want = np.fmod(x, y) if fmod else np.mod(x, y)
        naive = x - y * np.floor(x / y) if not fmod else x - y * np.trunc(x / y)
    assert not np.array_equal(naive, want, equal_nan=True)  # the cases are hard ones
    got = _run(device, model, feed)["z"]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0]))  # zeros' signs too


# ----------------------------------------------------------------- Det, CumProd
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (5, 5)])
def test_det(device, shape):
    x = np.random.default_rng(len(shape) + shape[-1]).standard_normal(shape).astype(np.float32)
    _check_grads(device, _model([helper.make_node("Det", ["x"], ["y"])], {"x": x}, {"y": TensorProto.FLOAT}),
                 {"x": x}, lambda x: torch.linalg.det(x))


def _torch_cumprod(x, axis, exclusive, reverse):
    if reverse:
        x = x.flip(axis)
    y = torch.cumprod(x, axis)
    if exclusive:
        ones = torch.ones_like(y.narrow(axis, 0, 1))
        y = torch.cat([ones, y.narrow(axis, 0, y.shape[axis] - 1)], axis)
    return y.flip(axis) if reverse else y


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod(device, exclusive, reverse):
    x = np.random.default_rng(9).uniform(0.5, 1.5, (3, 7)).astype(np.float32)
    x[1, 3] = 0.0  # a zero: the gradients before it still flow
    proto = _model([helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)],
                   {"x": x}, {"y": TensorProto.FLOAT}, inits={"axis": np.array(1, np.int64)})
    _check_grads(device, proto, {"x": x}, lambda x: _torch_cumprod(x, 1, exclusive, reverse))


def test_cumprod_of_integers_wraps(device):
    x = np.array([[7, -3, 5, 9, 11, 13, 2, 7, 7, 7, 7, 7, 7, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]],
                 np.int32)
    proto = _model([helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=1)], {"x": x},
                   {"y": TensorProto.INT32}, inits={"axis": np.array(-1, np.int64)})
    got = _run(device, load_onnx(proto), {"x": x})["y"]
    want = np.concatenate([np.ones((2, 1), np.int64), np.cumprod(x.astype(np.int64), 1)[:, :-1]], 1)
    np.testing.assert_array_equal(got, (want % (1 << 32)).astype(np.uint32).view(np.int32))


# --------------------------------------------------------------------- BitCast
BITCASTS = [  # (input, ONNX output type)
    (np.array([1.0, -2.5, np.inf, -0.0, 3.4e38], np.float32), TensorProto.INT32),
    (np.array([1065353216, -1071644672, 0, -(1 << 31)], np.int32), TensorProto.FLOAT),
    (np.array([-1, -128, 127, 0], np.int8), TensorProto.UINT8),
    (np.array([255, 128, 127, 0], np.uint8), TensorProto.INT8),
    (np.array([1, 32768, 65535, 0], np.uint16), TensorProto.INT16),
    (np.array([-1, -32768, 32767, 5], np.int16), TensorProto.UINT16),
    (np.array([True, False, True]), TensorProto.UINT8),
]


@pytest.mark.parametrize("x,to", BITCASTS, ids=lambda v: str(v) if isinstance(v, int) else str(np.asarray(v).dtype))
def test_bitcast(device, x, to):
    proto = _model([helper.make_node("BitCast", ["x"], ["y"], to=to)], {"x": x}, {"y": to})
    got = _run(device, load_onnx(proto), {"x": x})["y"]
    want = x.view(helper.tensor_dtype_to_np_dtype(to))
    if got.dtype == want.dtype:  # 32 bits: bit for bit (-0.0 too)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(got, want)


def test_bitcast_of_other_widths_is_refused():
    proto = _model([helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT16)],
                   {"x": np.zeros(3, np.float32)}, {"y": TensorProto.INT16})
    with pytest.raises(NotImplementedError, match="BitCast from ONNX type 1 to 5"):
        load_onnx(proto)


# ---------------------------------------------------------- SwiGLU, BatchNorm
@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_swiglu(device, alpha):
    rng = np.random.default_rng(2)
    feed = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal((3, 5)).astype(np.float32)}
    _check_grads(device, _model([helper.make_node("SwiGLU", ["a", "b"], ["y"], alpha=alpha)], feed,
                                {"y": TensorProto.FLOAT}, opset=28),
                 feed, lambda a, b: a * torch.sigmoid(alpha * a) * b)


def test_batchnorm_training_mode(device):
    """y from the batch's statistics (gradients as torch's train() mode); the running ones out
    as running * momentum + batch * (1 - momentum), the batch's variance biased (ONNX's)."""
    rng = np.random.default_rng(8)
    feed = {"x": rng.standard_normal((2, 3, 4, 5)).astype(np.float32), "s": rng.standard_normal(3).astype(np.float32),
            "bias": rng.standard_normal(3).astype(np.float32), "mean": rng.standard_normal(3).astype(np.float32),
            "var": rng.uniform(0.5, 1.5, 3).astype(np.float32)}
    node = helper.make_node("BatchNormalization", list(feed), ["y", "rm", "rv"], training_mode=1, momentum=0.8,
                            epsilon=1e-3)
    proto = _model([node], feed, {k: TensorProto.FLOAT for k in ("y", "rm", "rv")}, opset=15)

    def torch_fn(x, s, bias, mean, var):
        y = F.batch_norm(x, None, None, s, bias, training=True, eps=1e-3)
        bm, bv = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
        m = float(np.float32(0.8))  # (ONNX float attributes are float32)
        return y, mean * m + bm * (1 - m), var * m + bv * (1 - m)
    _check_grads(device, proto, feed, torch_fn)


# ------------------------------------------------------ ai.onnx.preview.training
def _training_case(op, inputs, outputs, attrs, t):
    rng = np.random.default_rng(len(inputs) + t)
    feed = {"R": np.array(0.1, np.float32), "T": np.array(t, np.int64)}
    for name in inputs:
        feed[name] = (rng.uniform(0.1, 2.0, 3) if name[0] == "H" else rng.standard_normal(3)).astype(np.float32)
    proto = _model([helper.make_node(op, list(feed), outputs, domain=TRAINING, **attrs)], feed,
                   {k: TensorProto.FLOAT for k in outputs}, opset=21, domains=[TRAINING])
    return proto, feed


@pytest.mark.parametrize("op,inputs,outputs,attrs", [
    ("Momentum", ["X1", "X2", "G1", "G2", "V1", "V2"], ["X1n", "X2n", "V1n", "V2n"],
     {"norm_coefficient": 0.01, "alpha": 0.9, "beta": 0.5, "mode": "standard"}),
    ("Momentum", ["X", "G", "V"], ["Xn", "Vn"], {"norm_coefficient": 0.01, "alpha": 0.9, "beta": 0.5, "mode": "nesterov"}),
    ("Adam", ["X1", "X2", "G1", "G2", "V1", "V2", "H1", "H2"], ["X1n", "X2n", "V1n", "V2n", "H1n", "H2n"],
     {"norm_coefficient": 0.01, "norm_coefficient_post": 0.02, "alpha": 0.9, "beta": 0.99, "epsilon": 1e-3}),
    ("Adagrad", ["X", "G", "H"], ["Xn", "Hn"], {"norm_coefficient": 0.01, "epsilon": 1e-4, "decay_factor": 0.1}),
], ids=["momentum", "nesterov", "adam", "adagrad"])
@pytest.mark.parametrize("t", [0, 3])
def test_training_updates(device, op, inputs, outputs, attrs, t):
    """The first step (T = 0: no bias correction, beta taken as 1) and a later one."""
    proto, feed = _training_case(op, inputs, outputs, attrs, t)
    want = ReferenceEvaluator(proto).run(None, feed)
    model = load_onnx(proto)
    ref = run_graph(model.graph, feed, np.float64)[0]
    got = _run(device, model, feed)
    for name, w in zip(outputs, want):
        assert _rel(ref[name], w) < 1e-6, f"{name}: interpreter {_rel(ref[name], w):.3g}"
        assert _rel(got[name], w) < 1e-5, f"{name}: GPU {_rel(got[name], w):.3g}"


# ------------------------------------------------------------ ConstantOfShape
def test_constant_of_shape_needs_a_known_shape():
    """A shape computed at run time is refused in the words the backend's specialisation reads;
    known, it folds."""
    node = helper.make_node("ConstantOfShape", ["s"], ["y"], value=numpy_helper.from_array(np.array([2.5], np.float32)))
    proto = _model([node], {"s": np.array([2, 3], np.int64)}, {"y": TensorProto.FLOAT})
    with pytest.raises(NotImplementedError, match=re.escape("('s') must be a constant")):
        load_onnx(proto)
    proto = _model([node], {}, {"y": TensorProto.FLOAT}, inits={"s": np.array([2, 3], np.int64)})
    model = load_onnx(proto)
    np.testing.assert_array_equal(run_graph(model.graph, {}, np.float64)[0]["y"], np.full((2, 3), 2.5))

"""ONNX signal and math ops on computed values: DFT, STFT, the window and mel matrices,
general Einsum, Floor / Ceil / ReduceProd. Hand-built graphs imported and run by the
float64 interpreter; outputs and the gradients of sum(output * ct) compared on full
tensors with torch autograd (float64); one model of them all on the GPU."""
import numpy as np
import pytest
import torch
from meganeura.compiler import compile_graph, run_graph
from meganeura.compiler.onnx_import import load_onnx
from meganeura.runtime import Package, Session
from onnx import TensorProto, helper, numpy_helper
from test_onnx_seq_ops import with_gradients

TOL = {"rtol": 1e-10, "atol": 1e-10}


def _model(nodes, inputs: dict, outputs, inits=(), opset=20):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _int(name, v):
    return numpy_helper.from_array(np.array(v, np.int64), name)


def _check(proto, feed, torch_fn, tol=TOL):
    """Outputs and input gradients of the imported model against torch_fn (float64)."""
    model = load_onnx(proto)
    rng = np.random.default_rng(7)
    tins = {k: torch.tensor(v, requires_grad=True) for k, v in feed.items()}
    touts = torch_fn(**tins)
    touts = touts if isinstance(touts, tuple) else (touts,)
    cts = [rng.standard_normal(tuple(t.shape)) for t in touts]
    sum((t * torch.tensor(c)).sum() for t, c in zip(touts, cts)).backward()
    names = list(model.graph.outputs)
    g = with_gradients(model, {k: c.shape for k, c in zip(names, cts)}, list(feed))
    got = run_graph(g, {**feed, **{f"ct.{k}": c for k, c in zip(names, cts)}})[0]
    for k, t in zip(names, touts):
        np.testing.assert_allclose(got[k], t.detach().numpy(), **tol, err_msg=k)
    for k, t in tins.items():
        want = t.grad.numpy() if t.grad is not None else np.zeros(t.shape)
        np.testing.assert_allclose(got[f"grad.{k}"], want, **tol, err_msg=f"grad.{k}")


def _c(x):
    return torch.view_as_complex(x)


def _r(z):
    return torch.view_as_real(z)


# name -> (input shape, attributes, dft_length or None, axis, opset, torch function of x)
DFTS = {
    "fft_real": ((2, 8, 3, 1), {}, None, 1, 20, lambda x: _r(torch.fft.fft(x[..., 0], dim=1))),
    "ifft_complex_axis_minus2": ((2, 3, 6, 2), {"inverse": 1}, None, -2, 20, lambda x: _r(torch.fft.ifft(_c(x), dim=2))),
    "rfft_padded": ((2, 7, 3, 1), {"onesided": 1}, 10, 1, 20, lambda x: _r(torch.fft.rfft(x[..., 0], n=10, dim=1))),
    "fft_cut": ((2, 8, 3, 2), {}, 5, 1, 20, lambda x: _r(torch.fft.fft(_c(x), n=5, dim=1))),
    "irfft_odd": ((2, 5, 3, 2), {"inverse": 1, "onesided": 1}, 9, 1, 20,
                  lambda x: torch.fft.irfft(_c(x), n=9, dim=1)[..., None]),
    "irfft_even": ((3, 6, 2), {"inverse": 1, "onesided": 1}, None, 1, 17,
                   lambda x: torch.fft.irfft(_c(x), n=10, dim=1)[..., None]),
    "rfft_opset17_axis2": ((2, 3, 8, 1), {"onesided": 1, "axis": 2}, None, 2, 17,
                           lambda x: _r(torch.fft.rfft(x[..., 0], dim=2))),
}


@pytest.mark.parametrize("name", list(DFTS))
def test_dft_matches_torch_fft(name):
    shape, at, n, axis, opset, fn = DFTS[name]
    inits = [_int("n", n)] if n is not None else []
    ins = ["x", "n" if n is not None else ""]
    if opset >= 20:
        inits.append(_int("axis", axis))
        ins.append("axis")
    proto = _model([helper.make_node("DFT", ins, ["y"], **at)], {"x": shape}, ["y"], inits, opset)
    x = np.random.default_rng(1).standard_normal(shape)
    _check(proto, {"x": x}, fn)


def _torch_stft(sig, win, onesided=True):
    z = torch.stft(sig[..., 0] if sig.shape[-1] == 1 else _c(sig), n_fft=win.shape[0], hop_length=6, window=win, center=False,
                   onesided=onesided, return_complex=True)
    return _r(z.transpose(1, 2))


def test_stft_with_a_computed_window_matches_torch():
    """A real signal and a window that is a graph input: gradients for both."""
    proto = _model([helper.make_node("STFT", ["s", "step", "w", "len"], ["y"])], {"s": (2, 40, 1), "w": (10,)},
                   ["y"], [_int("step", 6), _int("len", 10)], 17)
    rng = np.random.default_rng(2)
    feed = {"s": rng.standard_normal((2, 40, 1)), "w": rng.uniform(0.5, 1.0, 10)}
    _check(proto, feed, lambda s, w: _torch_stft(s, w))


def test_stft_of_a_complex_signal_with_a_folded_hann_window_matches_torch():
    nodes = [helper.make_node("HannWindow", ["size"], ["w"]),
             helper.make_node("STFT", ["s", "step", "w"], ["y"], onesided=0)]
    proto = _model(nodes, {"s": (2, 33, 2)}, ["y"], [_int("step", 6), _int("size", 8)], 17)
    s = np.random.default_rng(3).standard_normal((2, 33, 2))
    win = torch.tensor((np.sin(np.pi * np.arange(8) / 8) ** 2).astype(np.float32), dtype=torch.float64)  # float32
    _check(proto, {"s": s}, lambda s: _torch_stft(s, win, onesided=False))


@pytest.mark.parametrize("periodic", [1, 0])
def test_window_and_mel_matrices_fold_at_import(periodic):
    nodes = [helper.make_node(op, ["size"], [op], periodic=periodic)
             for op in ("HannWindow", "HammingWindow", "BlackmanWindow")]
    nodes.append(helper.make_node("MelWeightMatrix", ["bins", "dft", "rate", "lo", "hi"], ["mel"]))
    inits = [_int("size", 11), _int("bins", 8), _int("dft", 64), _int("rate", 16000),
             numpy_helper.from_array(np.array(30.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(7000.0, np.float32), "hi")]
    proto = _model(nodes, {}, ["HannWindow", "HammingWindow", "BlackmanWindow", "mel"], inits, 17)
    model = load_onnx(proto)
    assert not [n for n in model.graph.nodes if n.op not in ("param", "constant")]  # all folded
    got = run_graph(model.graph, {})[0]
    p = bool(periodic)
    want = {"HannWindow": torch.hann_window(11, p, dtype=torch.float64),
            "HammingWindow": torch.hamming_window(11, p, alpha=25 / 46, beta=21 / 46, dtype=torch.float64),
            "BlackmanWindow": torch.blackman_window(11, p, dtype=torch.float64)}
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w.numpy(), rtol=1e-6, atol=1e-7, err_msg=k)
    from onnx.reference import ReferenceEvaluator
    np.testing.assert_allclose(got["mel"], ReferenceEvaluator(proto).run(["mel"], {})[0], rtol=1e-6, atol=1e-7)


EINSUMS = [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ii->i", [(4, 4)]), ("bii->b", [(2, 3, 3)]),
           ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]), ("i,j->ij", [(3,), (4,)]), ("ij->", [(3, 4)]),
           ("ji", [(3, 4)]), ("bij,bkj", [(2, 3, 4), (2, 5, 4)]), ("iij,jk->ik", [(3, 3, 4), (4, 2)]),
           ("ab...,b...->a...", [(2, 3, 4, 5), (3, 1, 5)]), ("a,b,c->abc", [(2,), (3,), (4,)]),
           ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
           ("iji->j", [(3, 4, 3)]), (",ij->ij", [(), (2, 3)]), ("Ab,bA->", [(2, 3), (3, 2)]),
           ("i...,i...->...", [(3, 1, 4), (3, 5, 1)]), ("i,i", [(5,), (5,)])]


@pytest.mark.parametrize("eq,shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum_matches_torch(eq, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    proto = _model([helper.make_node("Einsum", names, ["y"], equation=eq)], dict(zip(names, shapes)), ["y"],
                   opset=17)
    rng = np.random.default_rng(4)
    feed = {n: rng.standard_normal(s) for n, s in zip(names, shapes)}
    _check(proto, feed, lambda **xs: torch.einsum(eq, *[xs[n] for n in names]))


def test_floor_ceil_reduce_prod_on_computed_values_match_torch():
    nodes = [helper.make_node("Mul", ["x", "three"], ["x3"]),
             helper.make_node("Floor", ["x3"], ["fl"]), helper.make_node("Ceil", ["x3"], ["ce"]),
             helper.make_node("Add", ["fl", "x"], ["fx"]),
             helper.make_node("ReduceProd", ["x", "ax"], ["p1"], keepdims=0),
             helper.make_node("ReduceProd", ["x"], ["p_all"])]
    inits = [numpy_helper.from_array(np.array(3.0, np.float32), "three"), _int("ax", [1])]
    proto = _model(nodes, {"x": (4, 7, 3)}, ["fx", "ce", "p1", "p_all"], inits, 18)
    x = np.random.default_rng(5).uniform(0.6, 1.5, (4, 7, 3)) * np.sign(np.random.default_rng(6).standard_normal((4, 7, 3)))
    x[0, 2, 1], x[1, :2, 0] = 0.0, [-1.0, 2.0 / 3.0]  # a zero in a product; exact multiples
    x[2, 3, 2] = -(2.0 ** 24)  # floor of a float beyond 2^23 is itself

    def fn(x):
        x3 = x * 3.0
        return torch.floor(x3) + x, torch.ceil(x3), x.prod(1), x.prod().reshape(1, 1, 1)
    _check(proto, {"x": x}, fn, {"rtol": 1e-12, "atol": 1e-12})


def test_signal_and_einsum_ops_on_the_gpu(device):
    """rfft, STFT with a computed window, einsum, floor and a product on the GPU, and
    their gradients, against torch."""
    nodes = [helper.make_node("Unsqueeze", ["s", "minus1"], ["s1"]),
             helper.make_node("DFT", ["s1", "", "one"], ["spec"], onesided=1),
             helper.make_node("STFT", ["s1", "step", "w"], ["st"]),
             helper.make_node("Einsum", ["a", "c"], ["e"], equation="bij,bkj->bik"),
             helper.make_node("Floor", ["e"], ["fe"]), helper.make_node("Add", ["fe", "e"], ["f"]),
             helper.make_node("ReduceProd", ["a", "minus1"], ["p"], keepdims=0)]
    inits = [_int("minus1", [-1]), _int("one", 1), _int("step", 6)]
    shapes = {"s": (2, 40), "w": (10,), "a": (2, 3, 5), "c": (2, 4, 5)}
    proto = _model(nodes, shapes, ["spec", "st", "f", "p"], inits, 20)
    rng = np.random.default_rng(8)
    feed = {k: rng.standard_normal(s) for k, s in shapes.items()}
    model = load_onnx(proto)
    names = list(model.graph.outputs)
    tins = {k: torch.tensor(v, requires_grad=True) for k, v in feed.items()}
    e = torch.einsum("bij,bkj->bik", tins["a"], tins["c"])
    touts = [_r(torch.fft.rfft(tins["s"], dim=1)), _torch_stft(tins["s"][..., None], tins["w"]),
             torch.floor(e) + e, tins["a"].prod(-1)]
    cts = [rng.standard_normal(tuple(t.shape)) for t in touts]
    sum((t * torch.tensor(c)).sum() for t, c in zip(touts, cts)).backward()
    g = with_gradients(model, {k: c.shape for k, c in zip(names, cts)}, list(feed))
    session = Session(device, Package.from_bytes(compile_graph(g)))
    got = session.run("infer", {**feed, **{f"ct.{k}": c for k, c in zip(names, cts)}})
    for k, t in zip(names, touts):
        np.testing.assert_allclose(got[k], t.detach().numpy(), rtol=1e-4, atol=1e-4, err_msg=k)
    for k, t in tins.items():
        np.testing.assert_allclose(got[f"grad.{k}"], t.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=k)

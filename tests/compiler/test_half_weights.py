"""Weights stored in half precision (compile with weights="f16"): which ones, the package's
bytes, and the answers of both kernel variants against torch and the float64 interpreter
computed from the same f16-rounded weights."""
import numpy as np
import pytest
from meganeura.compiler import Builder, TrainConfig, compile_model, run_graph
from meganeura.compiler.compile import compile_programs
from meganeura.runtime import Package, PackageError, Session

X_SHAPE = (2, 3, 11, 11)


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return {"pre.scale": 1 + rng.standard_normal((1, 3, 1, 1)) * 0.1,  # elementwise: f32
            "stem.weight": rng.standard_normal((8, 3, 3, 3)) * 0.3,  # conv, stride 2
            "stem.bias": rng.standard_normal(8) * 0.1,
            "mix.weight": rng.standard_normal((5, 8, 1, 1)) * 0.3,  # pointwise: a matmul through a reshape
            "left.weight": rng.standard_normal((7, 5)) * 0.3,  # the left operand of a matmul, odd size
            "fc.weight": rng.standard_normal((4, 7 * 36)) * 0.1,  # linear: x @ w^T, 16-byte loads along K
            "fc.bias": rng.standard_normal(4) * 0.1}


def _model(weights, frozen=()):
    b = Builder()
    x = b.input("x", X_SHAPE)
    p = {k: b.param(k, v, frozen=k in frozen) for k, v in weights.items()}
    h = b.relu(b.conv2d(x * p["pre.scale"], p["stem.weight"], stride=(2, 2), padding=(1, 1, 1, 1))
               + b.reshape(p["stem.bias"], (1, 8, 1, 1)))
    h = b.conv2d(h, p["mix.weight"])  # [2, 5, 6, 6]
    h = b.matmul(p["left.weight"], b.reshape(h, (2, 5, 36)))  # [2, 7, 36]
    b.output("y", b.linear(b.reshape(h, (2, 7 * 36)), p["fc.weight"], p["fc.bias"]))
    return b


def _torch_forward(weights, x):
    import torch
    import torch.nn.functional as F

    w = {k: torch.tensor(v) for k, v in weights.items()}
    h = F.relu(F.conv2d(torch.tensor(x) * w["pre.scale"], w["stem.weight"], w["stem.bias"], stride=2, padding=1))
    h = w["left.weight"] @ F.conv2d(h, w["mix.weight"]).reshape(2, 5, 36)
    return F.linear(h.reshape(2, -1), w["fc.weight"], w["fc.bias"]).numpy()


def _rounded(weights, names):
    """The weights as the package stores them: f32 (the model's), then f16 for `names`."""
    return {k: _half(v).astype(np.float64) if k in names else v for k, v in weights.items()}


def _half(v):
    return v.astype(np.float32).astype(np.float16)


HALF = {"stem.weight", "mix.weight", "left.weight", "fc.weight"}  # biases are added elementwise: f32


def test_which_weights_and_their_bytes():
    w = _weights()
    full = Package.from_bytes(compile_model(_model(w).build()))
    half = Package.from_bytes(compile_model(_model(w).build(), weights="f16"))
    dtypes = {t["name"]: t["dtype"] for t in half.manifest["tensors"] if t["role"] == "param"}
    assert {k for k, d in dtypes.items() if d == "f16"} == HALF
    for name in HALF:
        assert half.weights[name].dtype == np.float16
        np.testing.assert_array_equal(half.weights[name], _half(w[name]))
    # 4-byte arrays first in the blob: each array sits at a multiple of its item size from the
    # blob's data, also after an odd count of f16 values (left.weight's 35)
    f32 = {a.ctypes.data % 4 for a in half.weights.values() if a.dtype == np.float32}
    assert len(f32) == 1 and w["left.weight"].size % 2

    def weight_bytes(pkg):
        return sum(a.nbytes for a in pkg.weights.values())
    assert weight_bytes(full) - weight_bytes(half) == sum(w[k].size for k in HALF) * 2
    buffer_bytes = [sum(p.manifest["buffers"]) for p in (full, half)]
    assert buffer_bytes[0] - buffer_bytes[1] >= sum(w[k].size for k in HALF) * 2 - 16 * len(HALF)
    with pytest.raises(ValueError, match="weights must be one of"):
        compile_model(_model(w).build(), weights="bf16")


def test_trained_or_otherwise_read_weights_stay_f32():
    w = _weights()
    pkg = Package.from_bytes(compile_model(_model(w, frozen=("stem.weight", "mix.weight")).build(),
                                           TrainConfig(loss="mse", optimizer="sgd", lr=0.1), weights="f16"))
    dtypes = {t["name"]: t["dtype"] for t in pkg.manifest["tensors"] if t["role"] == "param"}
    assert {k for k, d in dtypes.items() if d == "f16"} == {"stem.weight", "mix.weight"}
    # a weight that a matmul and an elementwise kernel both read stays f32
    e = Builder()
    x = e.input("x", (3, 4))
    shared = e.param("shared", np.ones((4, 4)))
    e.output("y", e.matmul(x, shared) + e.sum(shared, axes=(0,)))
    pkg = Package.from_bytes(compile_model(e.build(), weights="f16"))
    assert [t["dtype"] for t in pkg.manifest["tensors"] if t["name"] == "shared"] == ["f32"]


def test_weights_beyond_half_range_stay_f32():
    w = _weights()
    w["fc.weight"] = w["fc.weight"].copy()
    w["fc.weight"][0, 0] = 1e5
    pkg = Package.from_bytes(compile_model(_model(w).build(), weights="f16"))
    dtypes = {t["name"]: t["dtype"] for t in pkg.manifest["tensors"] if t["role"] == "param"}
    assert dtypes["fc.weight"] == "f32" and dtypes["stem.weight"] == "f16"


@pytest.mark.parametrize("device_class", ["cpu", "gpu"])
def test_inference_matches_references_of_the_rounded_weights(device_class, device):
    w = _weights(1)
    x = np.random.default_rng(2).standard_normal(X_SHAPE)
    model = _model(w).build()
    s = Session(device, Package.from_bytes(compile_model(model, weights="f16")), device_class=device_class)
    got = s.run("infer", {"x": x.astype(np.float32)})["y"]
    rounded = _rounded(w, HALF)
    ref64 = run_graph(model.graph, {"x": x}, values=rounded)[0]["y"]
    ref_torch = _torch_forward(rounded, x)
    scale = np.abs(ref64).max()
    assert np.abs(got - ref64).max() / scale < 1e-5
    assert np.abs(got - ref_torch).max() / scale < 1e-5
    # the rounding itself is visible against the f32 weights (the test would notice f32 reads)
    assert np.abs(_torch_forward(w, x) - ref_torch).max() / scale > 1e-5
    assert {k: v.dtype for k, v in s.weights().items() if k in HALF} == {k: np.float16 for k in HALF}


@pytest.mark.parametrize("device_class", ["cpu", "gpu"])
def test_training_with_frozen_half_weights(device_class, device):
    """Frozen f16 weights after trained ones: the step's gradients flow through them (matmuls
    and a strided convolution's input gradient read f16 weights) and match the f64
    interpreter's step computed from the rounded weights."""
    rng = np.random.default_rng(3)
    w = _weights(3)
    frozen = ("stem.weight", "mix.weight", "left.weight", "fc.weight")
    b = _model(w, frozen=frozen)
    cfg = TrainConfig(loss="mse", optimizer="sgd", lr=0.05, weight_decay=0.0)
    pkg = Package.from_bytes(compile_model(b.build(), cfg, weights="f16"))
    dtypes = {t["name"]: t["dtype"] for t in pkg.manifest["tensors"] if t["role"] == "param"}
    assert {k for k, d in dtypes.items() if d == "f16"} == set(frozen)
    assert any(k["label"].startswith("conv_transpose2d") for k in pkg.manifest["kernels"])
    s = Session(device, pkg, device_class=device_class)
    x, target = rng.standard_normal(X_SHAPE), rng.standard_normal((2, 4))
    loss = s.run("train_step", {"x": x.astype(np.float32), "labels": target.astype(np.float32)})["loss"]

    from meganeura.compiler.ir.training import ROW_MASK, build_training_graph

    tg = build_training_graph(_model(w, frozen=frozen).build().graph, cfg)
    outs, assigned = run_graph(tg, {"x": x, "labels": target, ROW_MASK: np.ones(2)}, values=_rounded(w, set(frozen)))
    assert abs(float(loss) - float(outs["loss"])) / abs(float(outs["loss"])) < 1e-5
    for name in ("pre.scale", "stem.bias", "fc.bias"):
        step = assigned[name] - w[name]
        assert np.abs(s.read_tensor(name) - w[name] - step).max() / np.abs(step).max() < 1e-3, name


def test_programs_share_half_weights():
    """compile_programs: a weight every program reads through GEMMs only is f16; one that
    another program reads elementwise, or holds as a state, stays f32."""
    w = _weights(4)
    other = Builder()
    x = other.input("features", (3, 7 * 36))
    fc = other.param("fc.weight", w["fc.weight"])
    left = other.param("left.weight", w["left.weight"])
    other.output("y", other.linear(x, fc) + other.sum(left))  # fc: a matmul here too; left: read elementwise
    other.output("z", other.state("mix.weight", w["mix.weight"].shape) * 2.0)  # a state of the same name
    pkg = Package.from_bytes(compile_programs({"infer": _model(w).build().graph, "other": other.g}, weights="f16"))
    assert {t["name"] for t in pkg.manifest["tensors"] if t["dtype"] == "f16"} == {"stem.weight", "fc.weight"}


MATMULS = {  # (weight shape, input shape, weight on the left, trans): every way GEMMs read a weight
    "split_k_along_k": ((50, 3000), (33, 3000), False, True),  # x @ w^T: 16-byte loads along K, split-K
    "rows_of_4": ((24, 72), (40, 24), False, False),  # x @ w: 4 columns at a time
    "left_128_tiles": ((2048, 16), (16, 2050), True, False),  # w @ x on 128-tiles, along K
    "left_transposed": ((16, 2048), (16, 40), True, True),  # w^T @ x: 4 rows at a time
    "odd_everything": ((7, 13), (5, 13), False, True),  # scalar loads, an odd count of f16 values
}


@pytest.mark.parametrize("name", sorted(MATMULS))
@pytest.mark.parametrize("device_class", ["cpu", "gpu"])
def test_matmul_shapes_with_half_weights(name, device_class, device):
    ws, xs, left, trans = MATMULS[name]
    rng = np.random.default_rng(9)
    w, x = rng.standard_normal(ws) * 0.1, rng.standard_normal(xs)
    b = Builder()
    wp, xi = b.param("w", w), b.input("x", xs)
    y = b.matmul(wp, xi, trans_a=trans) if left else b.matmul(xi, wp, trans_b=trans)
    b.output("y", y)
    pkg = Package.from_bytes(compile_model(b.build(), weights="f16"))
    assert pkg.weights["w"].dtype == np.float16
    got = Session(device, pkg, device_class=device_class).run("infer", {"x": x.astype(np.float32)})["y"]
    h = _half(w).astype(np.float64)
    h = h.T if trans else h
    ref = h @ x if left else x @ h
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


def test_tiny_weights_stay_f32():
    """Weights near f16's smallest normal (6.1e-5) would round coarsely: they stay f32."""
    w = _weights()
    w["fc.weight"] = w["fc.weight"] * 1e-6
    pkg = Package.from_bytes(compile_model(_model(w).build(), weights="f16"))
    dtypes = {t["name"]: t["dtype"] for t in pkg.manifest["tensors"] if t["role"] == "param"}
    assert dtypes["fc.weight"] == "f32" and dtypes["stem.weight"] == "f16"


def test_load_weights_refuses_values_beyond_half_range(device, tmp_path):
    w = _weights(5)
    s = Session(device, Package.from_bytes(compile_model(_model(w).build(), weights="f16")))
    bad = {k: v.astype(np.float32) for k, v in w.items()}
    bad["fc.weight"][1, 2] = 7e4
    with pytest.raises(ValueError, match="fc.weight.*65504"):
        s.set_weights(bad)
    with pytest.raises(ValueError, match="fc.weight.*65504"):
        s.write_tensor("fc.weight", bad["fc.weight"], role="param")
    s.save_weights(tmp_path / "w.safetensors")  # f16 tensors saved as F16
    s.set_weights({"fc.weight": np.zeros_like(w["fc.weight"])}, strict=False)
    assert not s.read_tensor("fc.weight").any()
    s.load_weights(tmp_path / "w.safetensors")  # and loaded back
    np.testing.assert_array_equal(s.read_tensor("fc.weight"), _half(w["fc.weight"]))
    assert s.read_tensor("fc.weight").dtype == np.float16


def test_validator_allows_f16_for_parameters_only():
    from meganeura.runtime.package import validate_manifest

    m = dict(Package.from_bytes(compile_model(_model(_weights()).build(), weights="f16")).manifest)
    validate_manifest(m)
    m["tensors"] = [dict(t, dtype="f16") if t["role"] == "output" else t for t in m["tensors"]]
    with pytest.raises(PackageError, match="only parameters are stored in f16"):
        validate_manifest(m)


def test_a_transposed_weight_is_stored_in_order(device):
    """Importers hand over transposed views (ONNX's Gemm with transB=0): stored C-ordered."""
    rng = np.random.default_rng(10)
    w = rng.standard_normal((12, 6))
    x = rng.standard_normal((3, 12))
    b = Builder()
    b.output("y", b.matmul(b.input("x", x.shape), b.param("w", w.T, frozen=True),
                           trans_b=True))
    pkg = Package.from_bytes(compile_model(b.build(), weights="f16"))
    assert pkg.weights["w"].dtype == np.float16 and pkg.weights["w"].flags.c_contiguous
    np.testing.assert_array_equal(pkg.weights["w"], _half(w.T))
    got = Session(device, pkg).run("infer", {"x": x.astype(np.float32)})["y"]
    ref = x @ _half(w).astype(np.float64)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5

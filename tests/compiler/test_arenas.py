"""Parameter groups in shared buffers (compiler/arenas.py): the layout's rules, and a
training step with groups that does exactly what the same step without them does."""
import numpy as np
import pytest

from meganeura.compiler import Builder, TrainConfig, arenas, compile_model
from meganeura.runtime import Package, Session


def test_layout_keeps_order_limits_and_leaves_out_single_elements(monkeypatch):
    monkeypatch.setattr(arenas, "SMALLEST", 1024)
    monkeypatch.setattr(arenas, "GROUPS", 1000)
    sizes = {"a": 100, "scale": 1, "b": 64, "c": 300, "d": 10, "huge": 5000, "e": 3}
    groups = arenas.layout(sizes)
    assert [n for g in groups for n in g] == ["a", "b", "c", "d", "huge", "e"]  # order kept, "scale" out
    for g in groups:
        padded = sum(-(-sizes[n] // arenas.ALIGN) * arenas.ALIGN * 4 for n in g)
        assert padded <= 1024 or len(g) == 1, g  # a parameter larger than a group is one alone
    offsets, span = arenas.offsets(("a", "b", "c"), sizes)
    assert offsets == {"a": 0, "b": 128, "c": 192} and span == 492  # 256-byte aligned
    monkeypatch.setattr(arenas, "ARENAS", False)
    assert arenas.layout(sizes) == ()


def _model(rng):
    """Parameters of awkward sizes (padding between them in their arena) and a shared input."""
    b = Builder()
    x = b.input("x", (6, 7))
    h = b.relu(b.linear(x, b.param("l1.weight", rng.standard_normal((13, 7)) * 0.4),
                        b.param("l1.bias", rng.standard_normal(13) * 0.1)))
    h = h * b.param("scale.weight", np.ones(13)) + b.param("scale.bias", np.zeros(13))
    b.output("logits", b.linear(h, b.param("l2.weight", rng.standard_normal((5, 13)) * 0.4),
                                b.param("l2.bias", np.zeros(5))))
    return b.build()


def _train(device, cfg, grouped, monkeypatch, steps=3):
    monkeypatch.setattr(arenas, "ARENAS", grouped)
    monkeypatch.setattr(arenas, "SMALLEST", 512)  # several groups even for this model
    rng = np.random.default_rng(1)
    pkg = Package.from_bytes(compile_model(_model(np.random.default_rng(0)), cfg))
    s = Session(device, pkg)
    for _ in range(steps):
        s.run("train_step", {"x": rng.standard_normal((6, 7)), "labels": rng.integers(0, 5, 6)})
    labels = [pkg.manifest["kernels"][d["kernel"]]["label"] for d in pkg.programs["train_step"]["dispatches"]]
    state = {(t["role"], t["name"]): s.read_tensor(t["name"], t["role"])
             for t in s.tensors if t["role"] in ("param", "state")}
    return pkg, labels, state


@pytest.mark.parametrize("cfg", [TrainConfig(optimizer="adamw", lr=0.05, clip_norm=0.5),
                                 TrainConfig(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.01)],
                         ids=["adamw-clipped", "sgd-momentum"])
def test_a_grouped_step_is_the_same_step_bit_for_bit(device, cfg, monkeypatch):
    pkg, labels, grouped = _train(device, cfg, True, monkeypatch)
    placed = [t for t in pkg.manifest["tensors"] if t.get("offset")]
    assert {t["role"] for t in placed} == {"param", "state"}  # parameters and optimizer state at offsets
    widened = [label for label in labels if label.split(" x")[-1].isdigit() and "count" not in label]
    assert widened and len(widened) < 8, labels  # 8 parameters, updated by a few kernels
    _, plain_labels, plain = _train(device, cfg, False, monkeypatch)
    assert len(plain_labels) > len(labels)
    assert grouped.keys() == plain.keys()
    for key, value in plain.items():
        np.testing.assert_array_equal(grouped[key], value, err_msg=str(key))
    assert np.abs(plain[("param", "l1.weight")] - _model(np.random.default_rng(0)).graph.values["l1.weight"]).max() > 1e-3


def test_weights_at_offsets_save_and_load(device, tmp_path, monkeypatch):
    monkeypatch.setattr(arenas, "SMALLEST", 512)
    pkg = Package.from_bytes(compile_model(_model(np.random.default_rng(0)), TrainConfig(lr=0.05)))
    assert any(t.get("offset") for t in pkg.manifest["tensors"] if t["role"] == "param")
    s = Session(device, pkg)
    new = {name: np.full(value.shape, i + 0.5, np.float32) for i, (name, value) in enumerate(s.weights().items())}
    s.set_weights(new)
    s.save_weights(tmp_path / "w.safetensors")
    t = Session(device, pkg)
    t.load_weights(tmp_path / "w.safetensors")
    for name, value in new.items():
        np.testing.assert_array_equal(t.read_tensor(name), value, err_msg=name)  # neighbours untouched

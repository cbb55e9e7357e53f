"""Parameter groups in shared buffers (compiler/passes/arenas.py): the layout's rules, and a
training step with groups that does exactly what the same step without them does."""
import numpy as np
import pytest

from meganeura.compiler import Builder, TrainConfig, compile_model

from meganeura.compiler.ir.groups import ALIGN, layout
from meganeura.compiler.options import CompileOptions
from meganeura.compiler.passes import arenas
from meganeura.runtime import Package, Session


def test_layout_keeps_order_limits_and_leaves_out_single_elements():
    options = CompileOptions(arena_min_bytes=1024, arena_groups=1000)
    sizes = {"a": 100, "scale": 1, "b": 64, "c": 300, "d": 10, "huge": 5000, "e": 3}
    groups = layout(sizes, options)
    assert [n for g in groups for n in g] == ["a", "b", "c", "d", "huge", "e"]  # order kept, "scale" out
    for g in groups:
        padded = sum(-(-sizes[n] // ALIGN) * ALIGN * 4 for n in g)
        assert padded <= 1024 or len(g) == 1, g  # a parameter larger than a group is one alone
    offsets, span = arenas.offsets(("a", "b", "c"), sizes)
    assert offsets == {"a": 0, "b": 128, "c": 192} and span == 492  # 256-byte aligned
    assert layout(sizes, options.replace(arenas=False)) == ()


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


def _train(device, cfg, grouped, steps=3):
    options = CompileOptions(arenas=grouped, arena_min_bytes=512)  # several groups even for this model
    rng = np.random.default_rng(1)
    pkg = Package.from_bytes(compile_model(_model(np.random.default_rng(0)), cfg, options=options))
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
def test_a_grouped_step_is_the_same_step_bit_for_bit(device, cfg):
    pkg, labels, grouped = _train(device, cfg, True)
    placed = [t for t in pkg.manifest["tensors"] if t.get("offset")]
    assert {t["role"] for t in placed} == {"param", "state"}  # parameters and optimizer state at offsets
    groups = len({t["buffer"] for t in pkg.manifest["tensors"] if t["role"] == "param" and "offset" in t})
    assert f"parameter groups: {groups} (" in pkg.summary()
    widened = [label for label in labels if label.split(" x")[-1].isdigit() and "count" not in label]
    assert widened and len(widened) < 8, labels  # 8 parameters, updated by a few kernels
    _, plain_labels, plain = _train(device, cfg, False)
    assert len(plain_labels) > len(labels)
    assert grouped.keys() == plain.keys()
    for key, value in plain.items():
        np.testing.assert_array_equal(grouped[key], value, err_msg=str(key))
    assert np.abs(plain[("param", "l1.weight")] - _model(np.random.default_rng(0)).graph.values["l1.weight"]).max() > 1e-3


def test_weights_at_offsets_save_and_load(device, tmp_path):
    options = CompileOptions(arena_min_bytes=512)
    pkg = Package.from_bytes(compile_model(_model(np.random.default_rng(0)), TrainConfig(lr=0.05), options=options))
    assert any(t.get("offset") for t in pkg.manifest["tensors"] if t["role"] == "param")
    s = Session(device, pkg)
    new = {name: np.full(value.shape, i + 0.5, np.float32) for i, (name, value) in enumerate(s.weights().items())}
    s.set_weights(new)
    s.save_weights(tmp_path / "w.safetensors")
    t = Session(device, pkg)
    t.load_weights(tmp_path / "w.safetensors")
    for name, value in new.items():
        np.testing.assert_array_equal(t.read_tensor(name), value, err_msg=name)  # neighbours untouched


def test_a_program_training_part_of_a_group_leaves_the_rest_alone(device):
    """Two training programs of one package: "train_all" plans the groups, "train_head"
    trains only the head. Its updates must not be widened over the whole group (the frozen
    layer's slots there hold no gradient of this program)."""
    from meganeura.compiler.compile import compile_programs
    from meganeura.compiler.ir.training import build_training_graph

    m = _model(np.random.default_rng(0))
    full = build_training_graph(m.graph, TrainConfig(lr=0.05))
    head = build_training_graph(m.graph, TrainConfig(lr=0.05, freeze=["l1.*", "scale.*"]))
    pkg = Package.from_bytes(compile_programs({"infer": m.graph, "train_all": full, "train_head": head}))
    s = Session(device, pkg)
    rng = np.random.default_rng(1)
    before = s.weights()
    s.run("train_head", {"x": rng.standard_normal((6, 7)), "labels": rng.integers(0, 5, 6)})
    after = s.weights()
    for name in before:
        assert np.array_equal(before[name], after[name]) == (not name.startswith("l2.")), name
    s.run("train_all", {"x": rng.standard_normal((6, 7)), "labels": rng.integers(0, 5, 6)})
    assert not np.array_equal(after["l1.weight"], s.weights()["l1.weight"])


def test_an_update_reading_a_group_mate_is_the_same_step(device):
    """Without the NaN guard, w's gradient (upstream * a) is computed in w's update kernel,
    which then reads a and writes w: two tensors of one arena. The read is declared
    read_write (WebGPU refuses one buffer read and written in a dispatch); the step is the
    same as with every tensor in its own buffer."""
    def step(grouped):
        rng = np.random.default_rng(0)
        b = Builder()
        x = b.input("x", (6, 13))
        a = b.param("a", rng.standard_normal((1, 13)))
        w = b.param("w", rng.standard_normal((6, 13)))
        b.output("y", b.sum(x * (w * a), axes=(1,), keepdims=True))
        pkg = Package.from_bytes(compile_model(b.build(), TrainConfig(loss="mse", skip_nonfinite=False),
                                               options=CompileOptions(arenas=grouped)))
        s = Session(device, pkg)
        s.run("train_step", {"x": rng.standard_normal((6, 13)), "labels": np.zeros((6, 1))})
        return pkg, s.weights()
    pkg, grouped = step(True)
    kernels = pkg.manifest["kernels"]
    mixed = []  # (dispatch, buffer) where one buffer is bound twice and written
    for d in pkg.programs["train_step"]["dispatches"]:
        access = kernels[d["kernel"]]["access"]
        for b in {b for b in d["buffers"] if d["buffers"].count(b) > 1}:
            uses = [a for a, bb in zip(access, d["buffers"]) if bb == b]
            if "read_write" in uses:
                mixed.append(uses)
    assert mixed and all(set(uses) == {"read_write"} for uses in mixed), mixed
    _, plain = step(False)
    for name, value in plain.items():
        np.testing.assert_array_equal(grouped[name], value, err_msg=name)

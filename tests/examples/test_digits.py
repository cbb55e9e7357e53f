"""The vertical slice end to end: a torch-exported MLP compiled by the `meganeura`
command, trained with Session.run("train_step") on scikit-learn's digits."""
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import digits  # noqa: E402

from meganeura.compiler import TrainConfig, compile_model  # noqa: E402
from meganeura.compiler.onnx_import import load_onnx  # noqa: E402
from meganeura.runtime import Package, Session  # noqa: E402
from meganeura.runtime.training_state import deferred_buffers  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    model = digits.export_mlp(out / "mlp.onnx")
    digits.compile_package(out / "mlp.onnx", out / "mlp.mnpk", lr=0.003)  # through the console script
    return out, model


def test_compiling_the_mlp_takes_under_half_a_second(built):
    out, _ = built
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        compile_model(load_onnx(out / "mlp.onnx"), TrainConfig(loss="cross_entropy", optimizer="adamw", lr=0.003))
        best = min(best, time.perf_counter() - t)
    assert best < 0.5, f"compiling took {best:.3f} s"


def test_inference_matches_torch(built, device):
    out, model = built
    session = Session(device, out / "mlp.mnpk")
    xtr, xte, ytr, yte = digits.load_data()
    got = session.run("infer", {"x": xte})["logits"]  # 360 rows: split into compiled batches of 64
    ref = model(torch.tensor(xte)).detach().numpy()
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-4


def test_one_epoch_follows_torch_adamw(built, device):
    out, model = built
    session = Session(device, out / "mlp.mnpk")
    xtr, _, ytr, _ = digits.load_data()
    tm = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    tm.load_state_dict(model.state_dict())
    opt = torch.optim.AdamW(tm.parameters(), lr=0.003)
    order = np.random.default_rng(5).permutation(len(xtr))
    for s in range(0, len(xtr), 64):  # the last batch is partial: padded and masked on our side
        idx = order[s:s + 64]
        ours = session.run("train_step", {"x": xtr[idx], "labels": ytr[idx]})["loss"]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tm(torch.tensor(xtr[idx])), torch.tensor(ytr[idx]))
        loss.backward()
        opt.step()
        assert abs(float(ours) - loss.item()) < 1e-3 * max(1.0, loss.item()), s
    theirs = tm.state_dict()
    # Adam divides by sqrt(v): where a gradient is float noise (~1e-9) the step's sign is
    # noise too, so single elements may differ by a few learning rates after an epoch;
    # the tensors as a whole must agree (measured on lavapipe: 3e-4 to 5e-4 of their norm)
    for name, w in session.weights().items():
        ref = theirs[name].numpy()
        assert np.linalg.norm(w - ref) / np.linalg.norm(ref) < 2e-3, name


def test_trains_to_95_percent_and_saves_onnx_names(built, device, tmp_path):
    out, _ = built
    session = Session(device, out / "mlp.mnpk")
    xtr, xte, ytr, yte = digits.load_data()
    assert digits.accuracy(session, xte, yte) < 0.3  # untrained
    losses = digits.train(session, xtr, ytr, epochs=20, log=lambda msg: None)
    assert losses[-1] < losses[0] / 5
    acc = digits.accuracy(session, xte, yte)
    assert acc >= 0.95, f"test accuracy {acc:.3f}"
    session.save_weights(tmp_path / "w.safetensors")
    from safetensors.numpy import load_file

    names = sorted(load_file(str(tmp_path / "w.safetensors")))
    initializers = sorted(i.name for i in onnx.load(str(out / "mlp.onnx")).graph.initializer)
    assert names == initializers == ["0.bias", "0.weight", "2.bias", "2.weight"]
    fresh = Session(device, out / "mlp.mnpk")
    fresh.load_weights(tmp_path / "w.safetensors")
    assert digits.accuracy(fresh, xte, yte) == acc


def test_cli_info_and_errors(built, tmp_path, capsys):
    from meganeura.compiler.cli import main

    out, _ = built
    assert main(["info", str(out / "mlp.mnpk")]) == 0
    text = capsys.readouterr().out
    assert "program train_step" in text and "0.weight: f32[128, 64]" in text and "adamw" in text
    m = Package.load(out / "mlp.mnpk").manifest
    later = sum(m["buffers"][i] for i in deferred_buffers(m))
    assert 0 < later < m["memory"]["buffer_bytes"]
    assert f"({m['memory']['buffer_bytes'] - later} at load, the training state's {later} just after)" in text
    (tmp_path / "bad.mnpk").write_bytes(b"nonsense")
    assert main(["info", str(tmp_path / "bad.mnpk")]) == 1
    assert "not a meganeura package" in capsys.readouterr().err
    assert main(["compile", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "x.mnpk")]) == 2
    assert main(["compile", str(out / "mlp.onnx"), "-o", str(tmp_path / "f.mnpk"), "--train", "-q",
                 "--freeze", "0.*"]) == 0
    frozen = Session(None, tmp_path / "f.mnpk")
    before = frozen.weights()
    xtr, _, ytr, _ = digits.load_data()
    frozen.run("train_step", {"x": xtr[:64], "labels": ytr[:64]})
    after = frozen.weights()
    assert np.array_equal(before["0.weight"], after["0.weight"]) and np.array_equal(before["0.bias"], after["0.bias"])
    assert not np.array_equal(before["2.weight"], after["2.weight"])


def test_cli_half_weights(built, tmp_path, capsys):
    """`meganeura compile --weights f16`: the frozen first layer's weight is stored in f16 (the
    trained one stays f32) and inference matches torch with that weight rounded to f16."""
    from meganeura.compiler.cli import main

    out, model = built
    assert main(["compile", str(out / "mlp.onnx"), "-o", str(tmp_path / "h.mnpk"), "--train", "-q",
                 "--freeze", "0.*", "--weights", "f16"]) == 0
    assert main(["info", str(tmp_path / "h.mnpk")]) == 0
    text = capsys.readouterr().out
    assert "0.weight: f16[128, 64]" in text and "2.weight: f32" in text
    assert "in half precision (f16): 1 of them, 8192 values" in text
    session = Session(None, tmp_path / "h.mnpk")
    x = digits.load_data()[0][:64]
    import copy

    rounded = copy.deepcopy(model)  # (the fixture's model stays as exported)
    with torch.no_grad():
        rounded[0].weight.copy_(rounded[0].weight.half().float())
        ref = rounded(torch.tensor(x, dtype=torch.float32)).numpy()
    got = session.run("infer", {"x": x})
    got = got[next(iter(got))]
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5

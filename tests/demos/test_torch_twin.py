"""The PyTorch twin of the DinoVision model (bench/dinovision_torch.py, the benchmark's
PyTorch side) computes what meganeura's package computes: same weights, same answer."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from dinovision_torch import load  # noqa: E402

from meganeura.demos.dinovision.app import load_backbone  # noqa: E402
from meganeura.demos.dinovision.model import DemoConfig, compile_demo  # noqa: E402
from meganeura.runtime import Package, Session  # noqa: E402


@pytest.mark.parametrize("half_backbone", [False, True])
def test_the_torch_twin_matches_the_package(half_backbone, device):
    cfg = DemoConfig(height=64, width=80, eyes=2)
    weights = load_backbone()
    session = Session(device, Package.from_bytes(compile_demo(cfg, weights, seed=3, half_backbone=half_backbone)))
    rng = np.random.default_rng(1)  # random decoder weights (refine2 starts at zero otherwise)
    session.set_weights({k: rng.standard_normal(v.shape).astype(np.float32) * 0.2
                         for k, v in session.weights(only=["decoder.*"]).items()}, strict=False)
    stored = session.weights()  # the backbone as the package holds it (f16 for its matmuls with half_backbone)
    halves = sorted(k for k, v in stored.items() if v.dtype == np.float16)
    assert bool(halves) == half_backbone and not any(k.startswith("decoder.") for k in halves)
    w = {**weights, **{k: v.astype(np.float32) for k, v in stored.items()}}
    twin = load(cfg, w, dtype=torch.float64)
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 80)).astype(np.float32)
    ours = session.run("infer", {"pixel_values": x})["logits"]
    with torch.no_grad():
        ref = twin(torch.tensor(x, dtype=torch.float64)).numpy()
    assert ours.shape == ref.shape == (2, cfg.classes, 64, 80)
    assert np.abs(ours - ref).max() / np.abs(ref).max() < 1e-4


def test_labels_outside_the_classes_skip_the_decoders_step(device):
    """The demo's labels come from the engine's ID buffer, on the GPU: one outside the classes
    (in a labelled pixel) skips the step and is counted, the decoder untouched."""
    cfg = DemoConfig(height=32, width=32)
    session = Session(device, Package.from_bytes(compile_demo(cfg, load_backbone(), seed=3)))
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    session.run("infer", {"pixel_values": x})  # caches the features the decoder trains on
    rows = session.package.programs["train_decoder"]["inputs"]
    n = int(np.prod(session.tensors[rows["labels"]]["shape"]))
    before = session.weights(only=["decoder.*"])
    labels, mask = np.zeros(n, np.int32), np.ones(n, np.float32)
    labels[5] = cfg.classes  # one past the last class
    session.run("train_decoder", {"labels": labels, "label_mask": mask})
    assert session.skipped_steps == 1
    assert all(np.array_equal(v, session.weights(only=["decoder.*"])[k]) for k, v in before.items())
    labels[5], mask[7] = 2, 0.0
    labels[7] = -1  # outside the classes, but in a pixel nobody labelled: not counted
    session.run("train_decoder", {"labels": labels, "label_mask": mask})
    assert session.skipped_steps == 1
    assert not all(np.array_equal(v, session.weights(only=["decoder.*"])[k]) for k, v in before.items())

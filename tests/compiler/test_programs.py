"""Several programs in one package, handing a tensor over through a state: an inference
program caches features that a training program reads without recomputing them."""
import numpy as np
from meganeura.compiler import Builder, TrainConfig, run_graph
from meganeura.compiler.compile import compile_programs
from meganeura.compiler.ir.training import attach_optimizer
from meganeura.runtime import Package, Session


def _programs():
    rng = np.random.default_rng(0)
    w_back = rng.standard_normal((6, 5)) * 0.5
    w_head = rng.standard_normal((3, 6)) * 0.5
    # infer: x -> backbone (frozen) -> features (cached) -> head -> logits
    b = Builder()
    x = b.input("x", (4, 5))
    feats = b.tanh(b.matmul(x, b.param("backbone.weight", w_back, frozen=True), trans_b=True))
    cache = b.e.leaf("state", "cache.features", (4, 6))
    b.g.assigns["cache.features"] = feats.id
    b.output("logits", b.linear(feats, b.param("head.weight", w_head)))
    infer = b.g
    del cache
    # train: cached features -> head -> masked cross-entropy -> AdamW on the head only
    t = Builder()
    f = t.e.leaf("state", "cache.features", (4, 6))
    from meganeura.compiler.ir.builder import Tensor

    logits = t.linear(Tensor(t, f), t.param("head.weight", w_head))
    labels = t.input("labels", (4,), "i32")
    mask = t.input("mask", (4,))
    loss = t.cross_entropy(logits, labels, mask)
    t.output("loss", loss)
    train = attach_optimizer(t.g, loss.id, TrainConfig(optimizer="adamw", lr=0.05))
    return infer, train


def test_infer_caches_features_and_training_reads_them(device):
    infer, train = _programs()
    pkg = Package.from_bytes(compile_programs({"infer": infer, "train_head": train}))
    s = Session(device, pkg)
    x = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    logits = s.run("infer", {"x": x})["logits"]
    ref_out, ref_assign = run_graph(infer, {"x": x})
    assert np.abs(logits - ref_out["logits"]).max() < 1e-5
    assert np.abs(s.read_tensor("cache.features", "state") - ref_assign["cache.features"]).max() < 1e-5
    labels, mask = np.array([0, 2, 1, 2]), np.array([1, 1, 0, 1], np.float32)
    loss = s.run("train_head", {"labels": labels, "mask": mask})["loss"]
    ref_loss, ref_new = run_graph(train, {"labels": labels, "mask": mask}, values=ref_assign)
    assert abs(float(loss) - float(ref_loss["loss"])) < 1e-5
    assert np.abs(s.weights()["head.weight"] - ref_new["head.weight"]).max() < 1e-5
    assert np.array_equal(s.weights()["backbone.weight"], np.asarray(infer.values["backbone.weight"], np.float32))
    # the training program holds no backbone kernel: only the head's matmuls
    labels_of = [pkg.manifest["kernels"][d["kernel"]]["label"] for d in pkg.programs["train_head"]["dispatches"]]
    assert labels_of.count("matmul") == 2, labels_of  # forward, and the weight gradient


def test_shared_scratch_runs_the_same_in_less_memory(device):
    """compile_model(share_scratch=True): infer and train_step draw scratch from one pool;
    alternating them gives exactly the private-scratch package's results."""
    from meganeura.compiler import compile_model

    rng = np.random.default_rng(4)
    b = Builder()
    x = b.input("x", (16, 12))
    h = b.gelu(b.linear(x, b.param("fc1.weight", rng.standard_normal((32, 12)) * 0.3), b.param("fc1.bias", np.zeros(32))))
    b.output("logits", b.linear(h, b.param("fc2.weight", rng.standard_normal((5, 32)) * 0.3), b.param("fc2.bias", np.zeros(5))))
    model, cfg = b.build(), TrainConfig(optimizer="adamw", lr=0.01)
    private = Package.from_bytes(compile_model(model, cfg))
    shared = Package.from_bytes(compile_model(model, cfg, share_scratch=True))
    assert shared.manifest["memory"]["buffer_bytes"] < private.manifest["memory"]["buffer_bytes"]
    assert shared.manifest["memory"]["shared_scratch"] and not private.manifest["memory"]["shared_scratch"]
    a, s = Session(device, private), Session(device, shared)
    for step in range(3):
        batch = {"x": rng.standard_normal((16, 12)), "labels": rng.integers(0, 5, 16)}
        np.testing.assert_array_equal(a.run("train_step", batch)["loss"], s.run("train_step", batch)["loss"])
        np.testing.assert_array_equal(a.run("infer", {"x": batch["x"]})["logits"], s.run("infer", {"x": batch["x"]})["logits"])

"""A training step whose loss or gradients are not finite is rejected on the GPU:
weights, optimizer state and norm statistics stay as they were, and a counter says so."""
import numpy as np
import pytest

from meganeura.compiler import Builder, TrainConfig, compile_model, run_graph
from meganeura.compiler.ir.training import build_training_graph
from meganeura.runtime import Package, Session


def convnet(seed=0):
    """Conv + batch norm (running statistics are state too) + a linear head."""
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.input("x", (4, 3, 6, 6))
    h = b.conv2d(x, b.param("conv.weight", rng.standard_normal((5, 3, 3, 3)) * 0.3), stride=(1, 1),
                 padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)
    h = b.batch_norm(h, b.param("bn.weight", np.ones(5)), b.param("bn.bias", np.zeros(5)),
                     b.param("bn.running_mean", np.zeros(5)), b.param("bn.running_var", np.ones(5)),
                     eps=1e-5, momentum=0.1)
    h = b.reshape(b.relu(h), (4, 180))
    b.output("logits", b.linear(h, b.param("fc.weight", rng.standard_normal((3, 180)) * 0.1),
                                b.param("fc.bias", np.zeros(3))))
    return b.build()


def everything(session):
    """Every param and state tensor, read back from the GPU."""
    return {(t["role"], t["name"]): session.read_tensor(t["name"], t["role"])
            for t in session.tensors if t["role"] in ("param", "state")}


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_nan_batches_change_nothing_and_are_counted(device, optimizer):
    model = convnet()
    cfg = TrainConfig(optimizer=optimizer, lr=0.05)
    session = Session(device, Package.from_bytes(compile_model(model, cfg)))
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((4, 3, 6, 6)).astype(np.float32), rng.integers(0, 3, 4)) for _ in range(6)]
    poisoned = {1: np.nan, 3: np.inf, 4: -np.inf}  # step -> value injected into one pixel
    before_each, losses = [], []
    for step, (x, y) in enumerate(batches):
        if step in poisoned:
            x = x.copy()
            x[step % 4, 1, 2, 3] = poisoned[step]
        before_each.append(everything(session))
        losses.append(float(session.run("train_step", {"x": x, "labels": y}, check_finite=False)["loss"]))
    after = everything(session)
    assert session.skipped_steps == len(poisoned)
    for step in poisoned:  # (the loss itself may stay finite: GPU max() drops a NaN in ReLU)
        nxt = before_each[step + 1] if step + 1 < len(batches) else after
        for key, value in before_each[step].items():
            if key == ("state", "optimizer.skipped_steps"):
                assert nxt[key] == value + 1
            else:
                np.testing.assert_array_equal(nxt[key], value, err_msg=f"step {step} changed {key}")
    # the good steps equal the float64 interpreter running only the good batches
    tg = build_training_graph(model.graph, cfg)
    values = {}
    for step, (x, y) in enumerate(batches):
        if step in poisoned:
            continue
        ref, assigned = run_graph(tg, {"x": x, "labels": y, "__row_mask": np.ones(4)}, np.float64, values)
        values.update(assigned)
        assert abs(losses[step] - ref["loss"]) <= 1e-4 * abs(ref["loss"]), step
    for name in model.params:
        w = after[("param", name)]
        assert np.abs(w - values[name]).max() <= 1e-4 * max(np.abs(values[name]).max(), 1e-6), name


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_gradient_that_overflows_is_rejected_even_when_the_loss_is_finite(device, optimizer):
    """sqrt'(0) is infinite: the loss is finite, one gradient is not. Nothing changes: weights,
    AdamW's moments and step counter (its own selects) or SGD's momentum."""
    b = Builder()
    x = b.input("x", (2, 3))
    w = b.param("w", np.array([[1.0, 2.0, 0.0]]))
    b.output("y", b.reshape(b.sum(b.sqrt(w) * x, axes=(1,), keepdims=True), (2, 1)))
    session = Session(device, Package.from_bytes(compile_model(b.build(), TrainConfig(loss="mse", optimizer=optimizer))))
    before = everything(session)
    out = session.run("train_step", {"x": np.ones((2, 3)), "labels": np.zeros((2, 1))})
    assert np.isfinite(out["loss"])
    assert session.skipped_steps == 1
    np.testing.assert_array_equal(session.weights()["w"], [[1.0, 2.0, 0.0]])
    for key, value in everything(session).items():
        if key != ("state", "optimizer.skipped_steps"):
            np.testing.assert_array_equal(value, before[key], err_msg=str(key))


def test_without_the_guard_a_nan_loss_raises(device):
    b = Builder()
    b.output("y", b.linear(b.input("x", (4, 3)), b.param("w", np.ones((2, 3))), b.param("c", np.zeros(2))))
    pkg = Package.from_bytes(compile_model(b.build(), TrainConfig(loss="mse", skip_nonfinite=False)))
    assert pkg.plan.tensor("optimizer.skipped_steps", "state") is None
    session = Session(device, pkg)
    x = np.full((4, 3), np.nan, np.float32)
    with pytest.raises(FloatingPointError, match="not finite"):
        session.run("train_step", {"x": x, "labels": np.zeros((4, 2))}, check_finite=False)


def test_nan_inputs_are_refused_by_name(device):
    session = Session(device, Package.from_bytes(compile_model(convnet(), TrainConfig())))
    x = np.zeros((4, 3, 6, 6), np.float32)
    x[2, 0, 1, 5] = np.nan
    with pytest.raises(ValueError, match=r"input 'x' holds NaN or infinity \(first at index \(2, 0, 1, 5\)"):
        session.run("infer", {"x": x})
    assert session.skipped_steps == 0


def _sqrt_terms(n, bad):
    """y = sum_i sum(sqrt(w_i) * x): parameter `bad`'s gradient is infinite (sqrt' at 0)."""
    b = Builder()
    x = b.input("x", (2, 3))
    out = None
    for i in range(n):
        w = b.param(f"w{i}", np.array([[1.0, 2.0, 0.0 if i == bad else 3.0]]))
        term = b.sum(b.sqrt(w) * x, axes=(1,), keepdims=True)
        out = term if out is None else out + term
    b.output("y", b.reshape(out, (2, 1)))
    return b


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("bad", [0, 1, 2])
def test_one_bad_gradient_among_merged_checks_is_caught(device, bad, optimizer):
    """The loss and the gradients are checked by one kernel (count_nonfinite over all four; the
    gradients are ranges of one arena, apart by its padding): an infinite gradient in any one
    of them rejects the step. The three parameters' updates are one kernel."""
    b = _sqrt_terms(3, bad)
    pkg = Package.from_bytes(compile_model(b.build(), TrainConfig(loss="mse", optimizer=optimizer)))
    labels = [pkg.manifest["kernels"][d["kernel"]]["label"] for d in pkg.programs["train_step"]["dispatches"]]
    assert labels.count("count_nonfinite x4") == 1, labels  # the checks share a kernel
    assert len([label for label in labels if label.endswith(" x3")]) == 1, labels  # one update
    session = Session(device, pkg)
    before = everything(session)
    session.run("train_step", {"x": np.ones((2, 3)), "labels": np.zeros((2, 1))})
    assert session.skipped_steps == 1
    for key, value in everything(session).items():
        if key != ("state", "optimizer.skipped_steps"):
            np.testing.assert_array_equal(value, before[key], err_msg=str(key))


@pytest.mark.parametrize("bad", [0, 11, None])
def test_a_bad_gradient_in_any_counting_pass_is_caught(device, bad):
    """Twelve gradients with padding between them in their arena: thirteen ranges (with the
    loss) take two counting passes and a sum; a bad gradient in either pass rejects the step,
    and with none the step goes through though the arena's padding holds NaN."""
    b = _sqrt_terms(12, bad)
    pkg = Package.from_bytes(compile_model(b.build(), TrainConfig(loss="mse")))
    labels = [pkg.manifest["kernels"][d["kernel"]]["label"] for d in pkg.programs["train_step"]["dispatches"]]
    assert "count_nonfinite/sum" in labels, labels
    session = Session(device, pkg)
    persistent = {t["buffer"] for t in session.tensors if t["role"] != "output"}
    for i, buf in enumerate(session.buffers):  # scratch (the gradients' arena among it) full of NaN
        if i not in persistent:
            device.queue.write_buffer(buf, 0, np.full(buf.size // 4, np.nan, np.float32))
    before = everything(session)
    session.run("train_step", {"x": np.ones((2, 3)), "labels": np.zeros((2, 1))})
    if bad is None:
        assert session.skipped_steps == 0
        assert not np.array_equal(session.read_tensor("w5"), before[("param", "w5")])
        return
    assert session.skipped_steps == 1
    for key, value in everything(session).items():
        if key != ("state", "optimizer.skipped_steps"):
            np.testing.assert_array_equal(value, before[key], err_msg=str(key))

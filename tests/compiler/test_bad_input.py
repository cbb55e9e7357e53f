"""Cross-entropy labels a training step must not learn from: rows labelled ignore_index
leave the loss and the gradient as in torch's cross_entropy(ignore_index=...); a batch
with no row left, or a label outside the classes, is a skipped step (weights untouched,
counted), whoever wrote the labels. Checked in the interpreter (float64) and on the GPU."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from meganeura.compiler import Builder, TrainConfig, compile_model, run_graph
from meganeura.compiler.ir.training import ROW_MASK, build_training_graph
from meganeura.runtime import Package, Session

ROWS, FEATURES, CLASSES = 6, 4, 5
LR, DECAY = 1.0, 0.25  # SGD: new = w - LR * (grad + DECAY * w), so grad = w - new - DECAY * w


def linear_head(seed=0):
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.input("x", (ROWS, FEATURES))
    b.output("logits", b.linear(x, b.param("fc.weight", rng.standard_normal((CLASSES, FEATURES)) * 0.5),
                                b.param("fc.bias", rng.standard_normal(CLASSES) * 0.1)))
    return b.build()


def sgd(**kw):
    return TrainConfig(optimizer="sgd", lr=LR, momentum=0.0, weight_decay=DECAY, **kw)


def torch_step(params, x, labels, ignore_index=-100):
    """torch's loss and gradients (float64) of the linear head on these rows."""
    w = torch.tensor(params["fc.weight"], dtype=torch.float64, requires_grad=True)
    c = torch.tensor(params["fc.bias"], dtype=torch.float64, requires_grad=True)
    loss = F.cross_entropy(torch.tensor(x, dtype=torch.float64) @ w.T + c, torch.tensor(labels, dtype=torch.int64),
                           reduction="mean", ignore_index=ignore_index)
    loss.backward()
    return loss.item(), {"fc.weight": w.grad.numpy(), "fc.bias": c.grad.numpy()}


def grads_of(before, after):
    return {k: before[k] - after[k] - DECAY * before[k] for k in before}


def batch(seed=1):
    return np.random.default_rng(seed).standard_normal((ROWS, FEATURES))


# ------------------------------------------------------------------ interpreter
@pytest.mark.parametrize("labels, mask, ignore_index", [
    ([1, -100, 4, -100, 0, 2], [1] * ROWS, -100),
    ([1, -100, 4, 3, 0, -100], [1, 1, 1, 1, 0, 0], -100),  # padded rows (ROW_MASK) and ignored ones
    ([3, 3, 4, 0, 3, 2], [1] * ROWS, 3),  # ignore_index may be a class
])
def test_ignored_rows_leave_loss_and_gradient_as_in_torch(labels, mask, ignore_index):
    model = linear_head()
    tg = build_training_graph(model.graph, sgd(ignore_index=ignore_index))
    x = batch()
    out, assigned = run_graph(tg, {"x": x, "labels": np.array(labels), ROW_MASK: np.array(mask, float)})
    real = np.array(mask, bool)
    want_loss, want = torch_step(model.params, x[real], np.array(labels)[real], ignore_index)
    assert abs(out["loss"] - want_loss) <= 1e-5 * abs(want_loss)
    got = grads_of(model.params, assigned)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)
    assert assigned["optimizer.skipped_steps"] == 0


@pytest.mark.parametrize("labels", [
    [-100] * ROWS,  # nothing left to average
    [1, 2, CLASSES, 0, 1, 2],  # one past the last class
    [1, 2, -1, 0, 1, -100],  # negative, not ignore_index
    [1, 2, 2 ** 31 - 1, 0, 1, 2],
])
def test_steps_with_no_row_left_or_a_label_outside_the_classes_are_skipped(labels):
    model = linear_head()
    tg = build_training_graph(model.graph, TrainConfig(optimizer="adamw", lr=0.1))
    _, assigned = run_graph(tg, {"x": batch(), "labels": np.array(labels), ROW_MASK: np.ones(ROWS)})
    assert assigned["optimizer.skipped_steps"] == 1
    assert assigned["optimizer.step"] == 0
    for k, v in model.params.items():
        np.testing.assert_array_equal(assigned[k], v, err_msg=k)


def test_a_bad_label_in_a_padded_row_is_not_counted():
    model = linear_head()
    tg = build_training_graph(model.graph, sgd())
    labels, mask = np.array([1, 2, 0, 3, 99, -7]), np.array([1, 1, 1, 1, 0, 0], float)
    _, assigned = run_graph(tg, {"x": batch(), "labels": labels, ROW_MASK: mask})
    assert assigned["optimizer.skipped_steps"] == 0


@pytest.mark.parametrize("bad", [True, 1.5, 1 << 24])
def test_an_ignore_index_that_cannot_be_compared_exactly_is_refused(bad):
    with pytest.raises((TypeError, ValueError), match="ignore_index"):
        build_training_graph(linear_head().graph, TrainConfig(ignore_index=bad))


def test_the_manifest_records_ignore_index():
    pkg = Package.from_bytes(compile_model(linear_head(), sgd(ignore_index=7)))
    assert pkg.manifest["training"]["ignore_index"] == 7


# ------------------------------------------------------------------------- GPU
@pytest.fixture(scope="module")
def package():
    return Package.from_bytes(compile_model(linear_head(), sgd()))


def test_ignored_rows_on_the_gpu(device, package):
    """Five rows in a batch of six (the runtime pads and masks the sixth), two ignored."""
    session = Session(device, package)
    x, labels = batch()[:5].astype(np.float32), np.array([1, -100, 4, -100, 0])
    before = session.weights()
    loss = float(session.run("train_step", {"x": x, "labels": labels})["loss"])
    want_loss, want = torch_step(before, x, labels)
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss)
    got = grads_of({k: v.astype(np.float64) for k, v in before.items()}, session.weights())
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)
    assert session.skipped_steps == 0


def test_an_all_ignored_batch_skips_the_step_on_the_gpu(device, package):
    session = Session(device, package)
    before = session.weights()
    session.run("train_step", {"x": batch().astype(np.float32), "labels": np.full(ROWS, -100)})
    assert session.skipped_steps == 1
    for k, v in session.weights().items():  # (weight decay alone would have moved them)
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_labels_written_on_the_gpu_are_checked_there(device, package):
    """Labels a host writes straight into the input buffer (no CPU check on the way):
    one outside the classes skips the step and counts it, as a NaN gradient does."""
    session = Session(device, package)
    before = session.weights()
    t = package.plan.tensor("labels", "input")
    for step, bad in enumerate([CLASSES, -1], start=1):
        session.write_inputs("train_step", {"x": batch().astype(np.float32), "labels": np.zeros(ROWS, np.int64)})
        labels = np.array([0, 1, bad, 2, 3, 4], np.int32)
        device.queue.write_buffer(session.buffers[t.buffer], t.offset, labels.tobytes())
        encoder = device.create_command_encoder()
        session.record(encoder, "train_step")
        device.queue.submit([encoder.finish()])
        assert session.skipped_steps == step
    for k, v in session.weights().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)

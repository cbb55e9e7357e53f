"""A training package's training state (gradients, optimizer moments, kept activations, labels)
made after the load on a thread (runtime/training_state.py): inference runs before it exists,
whatever needs it waits for it, and a Session closing stops it."""
import threading
import time

import numpy as np
import pytest

from meganeura.compiler import Builder, TrainConfig, compile_model
from meganeura.runtime import Package, Session
from meganeura.runtime.gpu_objects import GpuObjects
from meganeura.runtime.training_state import TrainingState, deferred_buffers


def _package(train=True):
    rng = np.random.default_rng(3)
    b = Builder()
    x = b.input("x", (8, 12))
    h = b.relu(b.linear(x, b.param("fc1.weight", rng.standard_normal((16, 12))), b.param("fc1.bias", np.zeros(16))))
    b.output("logits", b.linear(h, b.param("fc2.weight", rng.standard_normal((5, 16))), b.param("fc2.bias", np.zeros(5))))
    return Package.from_bytes(compile_model(b.build(), TrainConfig(optimizer="adamw", lr=0.01) if train else None))


@pytest.fixture(scope="module")
def package():
    return _package()


def _batch(seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((8, 12)).astype(np.float32), "labels": rng.integers(0, 5, 8)}


@pytest.fixture(scope="module")
def expected(device, package):
    """A Session's logits, two losses and a moment after them, its training state made at once."""
    s = Session(device, package)
    logits = s.run("infer", {"x": _batch(0)["x"]})["logits"]
    losses = [s.run("train_step", _batch(i))["loss"] for i in range(2)]
    return logits, losses, s.read_tensor("optimizer.fc1.weight.exp_avg", "state")


@pytest.fixture
def gate(monkeypatch):
    """TrainingState._make waits for the returned event: the training state "being made"."""
    event, real = threading.Event(), TrainingState._make

    def held(self, *args):
        event.wait(60)
        return real(self, *args)
    monkeypatch.setattr(TrainingState, "_make", held)
    yield event
    event.set()


def test_the_deferred_buffers_are_the_training_steps_own(package):
    m = package.parsed
    later = deferred_buffers(m)
    infer = {b.buffer for d in m.programs["infer"].dispatches for b in d.bindings}
    weights = {t.buffer for t in m.tensors if t.init == "blob"}
    assert later and not later & (infer | weights)
    moments = {t.buffer for t in m.tensors if t.name.endswith((".exp_avg", ".exp_avg_sq"))}
    labels = m.programs["train_step"].inputs["labels"].buffer
    assert len(moments) >= 1 and moments | {labels} <= later
    assert deferred_buffers(package.manifest) == later  # (a manifest as stored: parsed first)
    assert deferred_buffers(_package(train=False).parsed) == set()  # nothing to defer


def test_inference_runs_while_the_training_state_is_made_and_training_waits_for_it(device, package, expected,
                                                                                   gate):
    want_logits, want_losses, want_moment = expected
    later = deferred_buffers(package.parsed)

    s = Session(device, package)
    assert not s.training_ready
    deferred_bytes = sum(package.plan.buffers[i] for i in later)
    at_load = s.allocated_bytes
    np.testing.assert_array_equal(s.run("infer", {"x": _batch(0)["x"]})["logits"], want_logits)
    losses, worker = [], threading.Thread(target=lambda: losses.extend(
        s.run("train_step", _batch(i))["loss"] for i in range(2)), daemon=True)
    worker.start()
    worker.join(0.3)
    assert worker.is_alive() and not losses  # waiting for the state
    gate.set()
    worker.join(60)
    assert s.training_ready and s.allocated_bytes == at_load + deferred_bytes
    np.testing.assert_array_equal(losses, want_losses)
    np.testing.assert_array_equal(s.read_tensor("optimizer.fc1.weight.exp_avg", "state"), want_moment)
    assert np.abs(want_moment).max() > 0
    assert set(s.programs) == {"infer", "train_step"}


def test_a_session_closed_while_its_training_state_is_made_stops_it(device, package, gate):
    s = Session(device, package)
    assert not s.training_ready
    at_load = s.allocated_bytes
    closing = threading.Thread(target=s.close, daemon=True)
    closing.start()
    end = time.monotonic() + 60
    while not s._training._thread.stopping.is_set():  # (cancelled before it makes anything)
        assert time.monotonic() < end and closing.is_alive()
        time.sleep(0.001)
    gate.set()
    closing.join(60)
    assert not closing.is_alive() and s.training_ready
    assert "closed" in str(s.training_error) and s.allocated_bytes == at_load
    with pytest.raises(RuntimeError, match="closed"):
        s.run("train_step", _batch(0))


def test_the_training_steps_own_kernels_compile_behind_the_load(device, package, expected, monkeypatch):
    """The load compiles what inference runs; the training step's own kernels compile beside its
    state (a first launch's driver time, most of it theirs). One the WGSL compiler rejects is
    the training step's error, named; inference runs on."""
    from meganeura.runtime import PackageError
    from meganeura.runtime.package import kernels_of

    m = package.manifest
    variant = "cpu" if device.adapter.info.get("adapter_type") == "CPU" else "gpu"  # (as `expected` ran)
    at_load, own = kernels_of(m, variant, ("infer",)), kernels_of(m, variant) - kernels_of(m, variant, ("infer",))
    assert at_load and own
    made, real = [], GpuObjects.pipeline

    def spy(self, i, *rest):
        made.append((i, threading.current_thread().name))
        return real(self, i, *rest)
    monkeypatch.setattr(GpuObjects, "pipeline", spy)
    with Session(device, package) as s:
        np.testing.assert_array_equal(s.run("infer", {"x": _batch(0)["x"]})["logits"], expected[0])
        np.testing.assert_array_equal([s.run("train_step", _batch(i))["loss"] for i in range(2)], expected[1])
    behind = {i for i, name in made if name.startswith("meganeura-training")}
    assert {i for i, _ in made} - behind == at_load and behind == own

    broken = dict(m, kernels=[dict(k, wgsl=k["wgsl"] + "\nfn broken() { let x: f32 = 1u; }") if i in own else k
                              for i, k in enumerate(m["kernels"])])
    with Session(device, Package(broken, package.weights)) as s:
        np.testing.assert_array_equal(s.run("infer", {"x": _batch(0)["x"]})["logits"], expected[0])
        with pytest.raises(PackageError, match=r"kernel \d+ .* rejected by the WGSL compiler"):
            s.run("train_step", _batch(0))
        assert isinstance(s.training_error, PackageError)
        np.testing.assert_array_equal(s.run("infer", {"x": _batch(0)["x"]})["logits"], expected[0])

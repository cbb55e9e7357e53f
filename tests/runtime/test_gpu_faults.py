"""GPU faults: out of memory at load, a lost device, and objects released while a command
buffer that uses them is still pending (wgpu-native aborts the process if one is destroyed)."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import wgpu

from meganeura.compiler import Builder, compile_model
from meganeura.runtime import DeviceLostError, GPUOutOfMemoryError, Package, Session
from meganeura.runtime.gpu_objects import GpuObjects
from meganeura.runtime.training_state import deferred_buffers


@pytest.fixture(scope="module")
def package(mlp_training_bytes):
    return Package.from_bytes(mlp_training_bytes)


class FailingDevice:
    """The host's device, except that its Nth buffer allocation fails as wgpu reports
    out of memory (a validation error raised by create_buffer)."""

    def __init__(self, device, fail_at):
        self._device, self.calls, self.fail_at = device, 0, fail_at

    def create_buffer(self, **kw):
        self.calls += 1
        if self.calls == self.fail_at:
            raise wgpu.GPUValidationError("Validation Error\n\nCaused by:\n  Not enough memory left.")
        return self._device.create_buffer(**kw)

    def __getattr__(self, name):
        return getattr(self._device, name)


def batch(seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((8, 12)).astype(np.float32), "labels": rng.integers(0, 5, 8)}


def test_out_of_memory_at_load_is_clear_and_the_device_stays_usable(device, package):
    at_load = len(package.plan.buffers) - len(deferred_buffers(package.parsed))
    for fail_at in sorted({1, at_load // 2 + 1, at_load}):
        with pytest.raises(GPUOutOfMemoryError, match=r"the package needs 0.0 MiB of GPU memory in \d+ buffers; "
                                                      r"the device could not allocate buffer \d+ .*Not enough memory"):
            Session(FailingDevice(device, fail_at), package)
    session = Session(device, package)  # the same device loads and runs the package afterwards
    assert np.isfinite(session.run("train_step", batch(0))["loss"])


def test_out_of_memory_in_the_training_state_leaves_inference_running(device, package):
    """The training state is made after the load: its allocation failing stops the training step
    (each time it is asked for, with the same clear error), not the inference."""
    later = deferred_buffers(package.parsed)
    assert len(later) >= 10  # the gradients, the moments, the labels, the activations kept
    at_load = len(package.plan.buffers) - len(later)
    session = Session(FailingDevice(device, at_load + 3), package)
    session.programs  # noqa: B018  (its state given up: inference's own staging buffer is not the one to fail)
    assert session.training_ready and isinstance(session.training_error, GPUOutOfMemoryError)
    sizes = session._objects.sizes[0]  # (the lifted sizes' uniform buffer, if the package has one)
    assert session.allocated_bytes == sum(package.plan.buffers) - sum(
        package.plan.buffers[i] for i in later) + (sizes.size if sizes is not None else 0)  # (nothing of the state kept)
    x = batch(0)["x"]
    logits = session.run("infer", {"x": x})["logits"]
    for _ in range(2):
        with pytest.raises(GPUOutOfMemoryError, match=r"the training state needs \d+\.\d MiB of GPU memory in "
                                                      f"{len(later)} buffers; the device could not allocate buffer"):
            session.run("train_step", batch(0))
    with pytest.raises(GPUOutOfMemoryError):
        session.read_tensor("optimizer.fc1.weight.exp_avg", "state")
    np.testing.assert_array_equal(session.run("infer", {"x": x})["logits"], logits)
    session.close()
    assert np.isfinite(Session(device, package).run("train_step", batch(0))["loss"])


def test_a_lost_device_is_detected_and_the_session_rebuilt_from_its_checkpoint(package, tmp_path):
    adapter = wgpu.gpu.request_adapter_sync()
    own = adapter.request_device_sync()  # not the shared default device: this one gets destroyed
    session = Session(own, package)
    for step in range(3):
        session.run("train_step", batch(step))
    session.save_weights(tmp_path / "last.safetensors")
    x = batch(9)["x"]
    before = session.run("infer", {"x": x})["logits"]
    own.destroy()  # what a driver reset or an unplugged GPU looks like to wgpu
    with pytest.raises(DeviceLostError, match="device was lost"):
        session.run("infer", {"x": x})
    with pytest.raises(DeviceLostError):
        session.run("train_step", batch(3))
    assert session.lost
    fresh = session.rebuild(weights=tmp_path / "last.safetensors")  # a new device, the last checkpoint
    assert fresh.device is not own
    np.testing.assert_allclose(fresh.run("infer", {"x": x})["logits"], before, rtol=1e-6, atol=1e-6)
    assert np.isfinite(fresh.run("train_step", batch(4))["loss"])


CLOSE_WHILE_PENDING = """
import gc
import numpy as np
import wgpu
from meganeura.compiler import Builder, compile_model
from meganeura.runtime import Package, Session

b = Builder()
x = b.input("x", (64, 64))
y = x
for i in range(6):
    y = b.relu(b.linear(y, b.param(f"l{i}.weight", np.eye(64) * 1.01), b.param(f"l{i}.bias", np.full(64, 0.01))))
b.output("y", y)
pkg = Package.from_bytes(compile_model(b.build()))
device = wgpu.gpu.request_adapter_sync().request_device_sync()
session = Session(device, pkg)
session.write_inputs("infer", {"x": np.ones((64, 64), np.float32)})
out = session.buffers[session.tensors[pkg.programs["infer"]["outputs"]["y"]]["buffer"]]
keep = device.create_buffer(size=64 * 64 * 4, usage=wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.MAP_READ)
enc = device.create_command_encoder()
session.record(enc, "infer")  # recorded, not yet submitted
enc.copy_buffer_to_buffer(out, 0, keep, 0, 64 * 64 * 4)
session.close()  # the host drops the session while its encoder still holds our dispatches
del session, out
gc.collect()
device.queue.submit([enc.finish()])
keep.map_sync(wgpu.MapMode.READ)
got = np.frombuffer(keep.read_mapped(), np.float32)
ref = np.ones(64, np.float64)
for i in range(6):
    ref = np.maximum(ref * 1.01 + 0.01, 0)
assert np.allclose(got, ref[0], rtol=1e-5), (got[:4], ref[0])
print("ok", got[0])
"""


def test_closing_a_session_while_its_work_is_pending_does_not_abort(tmp_path):
    """Run in a child process: a destroyed-while-pending buffer would SIGABRT it."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CLOSE_WHILE_PENDING)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ok")


def test_a_closed_session_says_so(device, package):
    session = Session(device, package)
    session.close()
    with pytest.raises(RuntimeError, match="closed"):
        session.run("infer", {"x": np.zeros((8, 12))})


@pytest.mark.parametrize("big", [False, True])
def test_a_failed_load_leaves_no_thread_behind(big, device, package, monkeypatch):
    """Pipelines and bind groups are made on threads beside the allocation and the upload: an
    allocation that fails mid-way raises its own error, and every load thread is gone when it
    does; `big`: the buffers made on a thread of their own (as for a gigabyte of weights)."""
    import threading

    from meganeura.runtime import loader as loader_module

    monkeypatch.setattr(loader_module, "LOAD_THREADS", 4)
    monkeypatch.setattr(loader_module, "BIG_UPLOAD", 0 if big else loader_module.BIG_UPLOAD)
    assert len(package.parsed.kernels) > 8  # enough kernels for the threads to be used
    before = set(threading.enumerate())  # (threads of earlier tests' sessions are theirs)
    with pytest.raises(GPUOutOfMemoryError):
        Session(FailingDevice(device, 3), package)
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("meganeura-")]


@pytest.mark.parametrize("big", [False, True])
def test_a_device_lost_during_the_weight_upload(big, package, monkeypatch):
    """The weights are written on threads: a device lost at the third write raises
    DeviceLostError, the writes not yet started are cancelled, and no load thread is left;
    `big`: as for a gigabyte of weights (buffers made and weights written on a thread of
    their own from the start, on twice the threads)."""
    import threading

    import time

    from meganeura.runtime import loader as loader_module

    monkeypatch.setattr(loader_module, "UPLOAD_THREADS", 2 if not big else 1)
    if big:
        monkeypatch.setattr(loader_module, "BIG_UPLOAD", 0)
    rng = np.random.default_rng(1)
    b = Builder()
    h = b.input("x", (2, 4))
    for i in range(20):  # 40 tensors to write
        h = b.linear(h, b.param(f"l{i}.weight", rng.standard_normal((4, 4))), b.param(f"l{i}.bias", np.zeros(4)))
    b.output("y", h)
    many = Package.from_bytes(compile_model(b.build()))
    own = wgpu.gpu.request_adapter_sync().request_device_sync()  # this one gets destroyed
    writes, real = [], GpuObjects.write

    def write(self, t, value, *rest):
        writes.append(t.name)
        if len(writes) == 3:
            own.destroy()
        elif len(writes) > 3:
            time.sleep(0.01)  # (slow writes: the cancellation, not a race, decides how many ran)
        return real(self, t, value, *rest)

    monkeypatch.setattr(GpuObjects, "write", write)
    before = set(threading.enumerate())  # (threads of earlier tests' sessions are theirs)
    # (with a gigabyte of weights the writes begin beside the load's other work, which may see the loss first)
    with pytest.raises(DeviceLostError, match="uploading the weights" if not big else "the GPU device was lost"):
        Session(own, many)
    assert 3 <= len(writes) <= 6 < 40  # the writes in flight finished; the rest were cancelled
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("meganeura-")]


def test_out_of_memory_while_writing_is_the_runtimes_error(device, package, monkeypatch):
    def write(self, t, value, *rest):
        raise wgpu.GPUOutOfMemoryError("Out of memory")

    monkeypatch.setattr(GpuObjects, "write", write)
    with pytest.raises(GPUOutOfMemoryError, match="uploading the weights: the GPU ran out of memory"):
        Session(device, package)

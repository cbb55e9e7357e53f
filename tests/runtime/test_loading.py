"""Session.load_in_background: a Session made on a thread of its own while the host's frames go
on; progress for a bar, the session or its error at the end."""
import os
import threading

import numpy as np
import pytest
from meganeura.compiler import Builder, TrainConfig, compile_model
from meganeura.runtime import Package, PackageError, Session
from meganeura.runtime.gpu_objects import GpuObjects


def _mlp(seed, width=64):
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.input("x", (4, 16))
    h = b.relu(b.matmul(x, b.param("w1", rng.standard_normal((16, width)).astype(np.float32) / 4)))
    b.output("y", b.matmul(h, b.param("w2", rng.standard_normal((width, 3)).astype(np.float32) / 8)))
    return compile_model(b.build(), TrainConfig(loss="mse", optimizer="adamw", lr=0.01))


def _held_compiles(monkeypatch) -> threading.Event:
    """GpuObjects.pipeline waits for the returned event: the driver "compiling" until the test
    lets it finish."""
    gate, real = threading.Event(), GpuObjects.pipeline

    def held(self, i, k, *counted):
        assert gate.wait(60)
        return real(self, i, k, *counted)
    monkeypatch.setattr(GpuObjects, "pipeline", held)
    return gate


def test_a_session_made_in_the_background_while_frames_run(device, tmp_path, monkeypatch):
    path = tmp_path / "big.mnpk"
    path.write_bytes(_mlp(1, width=256))
    frame = Session(device, Package.from_bytes(_mlp(2)))  # the host's running work
    x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
    want_frame = frame.run("infer", {"x": x})["y"]
    real = GpuObjects.pipeline
    gate = _held_compiles(monkeypatch)
    loading = Session.load_in_background(device, path, threads=2)
    try:
        seen = [loading.progress]
        for _ in range(3):  # frames go on, and their results are right, while it loads
            np.testing.assert_array_equal(frame.run("infer", {"x": x})["y"], want_frame)
            seen.append(loading.progress)
        assert not loading.done() and seen[-1] < 1.0
        with pytest.raises(TimeoutError):
            loading.result(timeout=0.05)
    finally:
        gate.set()
    session = loading.result(timeout=120)
    seen.append(loading.progress)
    assert loading.done() and seen[-1] == 1.0 and seen == sorted(seen)
    monkeypatch.setattr(GpuObjects, "pipeline", real)
    np.testing.assert_array_equal(session.run("infer", {"x": x})["y"],
                                  Session(device, Package.load(path)).run("infer", {"x": x})["y"])
    assert np.isfinite(session.run("train_step", {"x": x, "labels": np.zeros((4, 3), np.float32)})["loss"])


def test_a_background_load_hands_over_its_error(device, tmp_path, monkeypatch):
    from meganeura.compiler.package import blob

    monkeypatch.setattr(blob, "CHUNK", 1024)  # many checksum chunks: the last is read on a thread
    data = bytearray(_mlp(4))
    data[-40] ^= 0x01  # in the weights' last chunk: their checksum fails
    path = tmp_path / "bad.mnpk"
    path.write_bytes(bytes(data))
    loading = Session.load_in_background(device, path, threads=2)
    for _ in range(2):  # each time asked
        with pytest.raises(PackageError, match="damaged weights"):
            loading.result(timeout=120)
    assert loading.done() and loading.progress == 1.0
    with pytest.raises(PackageError, match="cannot read package"):
        Session.load_in_background(device, tmp_path / "missing.mnpk").result(timeout=120)
    with pytest.raises(TypeError):  # a wrong argument is the caller's error, at once
        Session.load_in_background(device, path, shader_check=False)


@pytest.mark.parametrize("mapped", [True, False])
def test_a_session_that_fails_stops_reading_its_file(mapped, device, tmp_path, monkeypatch):
    """Mapped (its checksums checked on threads) or read (where a file cannot be mapped)."""
    import time
    import zlib

    from meganeura.runtime import package as package_module
    from meganeura.runtime import threads as threads_module

    from meganeura.compiler.package import blob

    monkeypatch.setattr(blob, "CHUNK", 1024)  # the head is one chunk: the rest is read on a thread
    path = tmp_path / "p.mnpk"
    path.write_bytes(_mlp(5, width=512))
    monkeypatch.setattr(package_module, "READ_STEP", 512)
    real, crc = threads_module.os.preadv, zlib.crc32
    monkeypatch.setattr(threads_module.os, "preadv", lambda *a: time.sleep(0.01) or real(*a))  # a slow disk
    monkeypatch.setattr(package_module.zlib, "crc32", lambda *a: time.sleep(0.01) or crc(*a))  # slow checks
    if not mapped:
        monkeypatch.setattr(package_module, "_mapped", lambda *a: None)
    for bad in ({"memory_limit": 1024}, {"device_class": "tpu"}):
        with pytest.raises((ValueError, MemoryError)):
            Session(device, path, **bad)
        assert not [t for t in threading.enumerate() if t.name == "meganeura-read"]


def test_a_blocking_load_leaves_pythons_switch_interval_alone_unless_asked(device, tmp_path, monkeypatch):
    """Session() leaves the host's interpreter alone; with host_switch_interval it switches Python's
    threads at least that often while it loads (its threads' returns from wgpu and zlib then wait
    less for the constructor's own Python), and the host's interval comes back once it returns or
    fails; a host's shorter one stays."""
    import sys

    from meganeura.runtime import loading

    path = tmp_path / "p.mnpk"
    path.write_bytes(_mlp(6))
    seen, real = [], GpuObjects.pipeline

    def spy(self, *a, **kw):  # (the load's compiles; the training step's own run after it)
        if not threading.current_thread().name.startswith("meganeura-training"):
            seen.append(sys.getswitchinterval())
        return real(self, *a, **kw)
    monkeypatch.setattr(GpuObjects, "pipeline", spy)
    host = sys.getswitchinterval()
    asked = loading.SWITCH_INTERVAL
    try:
        with Session(device, path) as s:  # not asked: the host's own, throughout
            s.run("infer", {"x": np.ones((4, 16), np.float32)})
        assert seen and all(v == pytest.approx(host) for v in seen), seen
        seen.clear()
        with Session(device, path, host_switch_interval=asked) as s:
            assert sys.getswitchinterval() == pytest.approx(host)
            s.run("infer", {"x": np.ones((4, 16), np.float32)})
        assert seen and all(v == pytest.approx(asked, rel=0.05) for v in seen), seen
        with pytest.raises(PackageError):
            Session(device, tmp_path / "missing.mnpk", host_switch_interval=asked)
        assert sys.getswitchinterval() == pytest.approx(host) and loading._Shortened.loads == 0
        sys.setswitchinterval(0.0001)  # a host's own, shorter: kept
        seen.clear()
        Session(device, path, host_switch_interval=asked).close()
        assert seen and all(v == pytest.approx(0.0001, rel=0.05) for v in seen)
        assert sys.getswitchinterval() == pytest.approx(0.0001, rel=0.05)
        sys.setswitchinterval(host)
        other = loading.shorten_switch_interval(asked)  # a background load, running on
        sys.setswitchinterval(0.0002)  # the host's own, set meanwhile: still the host's when both end
        Session(device, path, host_switch_interval=asked).close()
        other()
        assert sys.getswitchinterval() == pytest.approx(0.0002, rel=0.05) and loading._Shortened.loads == 0
        sys.setswitchinterval(host)
        for bad in (0, -1.0, 1e-7, float("nan")):
            with pytest.raises(ValueError, match="host_switch_interval"):
                Session(device, path, host_switch_interval=bad)
        assert sys.getswitchinterval() == pytest.approx(host)
    finally:
        sys.setswitchinterval(host)


def test_a_background_load_shortens_pythons_switch_interval_only_when_asked(device, tmp_path, monkeypatch):
    """With host_switch_interval (or its older name, switch_interval) the loading threads' Python
    hands the interpreter back to the host's thread sooner while loads run, and the host's interval
    comes back when the last ends, after an error too; a host's shorter interval, or one it sets
    during a load, stays; without it the interval is left alone."""
    import sys

    from meganeura.runtime import loading

    path = tmp_path / "p.mnpk"
    path.write_bytes(_mlp(6))
    gate = _held_compiles(monkeypatch)
    asked = loading.SWITCH_INTERVAL

    def interval(want):  # (Python keeps whole microseconds)
        return pytest.approx(want, rel=0.05)
    host = sys.getswitchinterval()
    try:
        first = Session.load_in_background(device, path, threads=1, host_switch_interval=asked)
        second = Session.load_in_background(device, path, threads=1, switch_interval=asked)  # (the older name)
        assert sys.getswitchinterval() == interval(asked)
        gate.set()
        first.result(timeout=120), second.result(timeout=120)
        assert sys.getswitchinterval() == interval(host)
        gate.clear()
        untouched = Session.load_in_background(device, path, threads=1)  # (not asked)
        assert sys.getswitchinterval() == interval(host)
        gate.set()
        untouched.result(timeout=120)
        gate.clear()
        sys.setswitchinterval(0.0001)  # a host's own, shorter: kept during the load and after
        shorter = Session.load_in_background(device, path, threads=1, host_switch_interval=asked)
        assert sys.getswitchinterval() == interval(0.0001)
        gate.set()
        shorter.result(timeout=120)
        assert sys.getswitchinterval() == interval(0.0001)
        sys.setswitchinterval(host)
        gate.clear()
        changed = Session.load_in_background(device, path, threads=1, host_switch_interval=asked)
        sys.setswitchinterval(0.002)  # the host sets its own during the load: not undone
        gate.set()
        changed.result(timeout=120)
        assert sys.getswitchinterval() == interval(0.002)
        sys.setswitchinterval(host)
        failing = Session.load_in_background(device, tmp_path / "missing.mnpk", host_switch_interval=0.001)
        with pytest.raises(PackageError):
            failing.result(timeout=120)
        assert sys.getswitchinterval() == interval(host)
        for bad in (0, -1.0, 1e-7, float("nan")):
            with pytest.raises(ValueError, match="switch_interval"):
                Session.load_in_background(device, path, host_switch_interval=bad)
            with pytest.raises(ValueError, match="switch_interval"):
                Session.load_in_background(device, path, switch_interval=bad)
        with pytest.raises(TypeError, match="not both"):
            Session.load_in_background(device, path, host_switch_interval=asked, switch_interval=asked)
        assert sys.getswitchinterval() == interval(host)

        def no_thread(*a, **kw):
            raise RuntimeError("can't start new thread")
        monkeypatch.setattr(loading, "OnThread", no_thread)
        with pytest.raises(RuntimeError, match="new thread"):
            Session.load_in_background(device, path, host_switch_interval=asked)
        assert sys.getswitchinterval() == interval(host) and loading._Shortened.loads == 0
    finally:
        gate.set()
        sys.setswitchinterval(host)


def test_bind_groups_are_made_on_one_thread_beside_the_compiles(device, tmp_path, monkeypatch):
    """Making bind groups is Python bound by the GIL: on many threads it only queues a host's
    frame behind them (loader.BIND_GROUP_THREADS); the pipelines still compile on several."""
    from meganeura.runtime import loader as loader_module

    path = tmp_path / "p.mnpk"
    path.write_bytes(_mlp(7, width=128))
    made = {"bind_group": set(), "pipeline": set()}
    for name in made:
        def on(self, *a, _real=getattr(GpuObjects, name), _seen=made[name]):
            _seen.add((threading.get_ident(), threading.current_thread().name))
            return _real(self, *a)
        monkeypatch.setattr(GpuObjects, name, on)
    monkeypatch.setattr(loader_module, "LOAD_THREADS", 4)
    session = Session.load_in_background(device, path, threads=4).result(timeout=120)
    session.wait_tuned(), session.programs  # (the tuned tier's and the training step's groups too)
    # one thread at load, then one making the training step's after it (runtime/training_state.py)
    assert loader_module.BIND_GROUP_THREADS == 1
    assert sorted(name for _, name in made["bind_group"]) == ["meganeura-bind", "meganeura-training"]
    assert not made["bind_group"] & made["pipeline"]
    assert len(made["pipeline"]) > 1 or (os.cpu_count() or 1) < 2  # (pools never outnumber the cores)
    assert np.isfinite(session.run("infer", {"x": np.ones((4, 16), np.float32)})["y"]).all()


def test_a_gigabyte_of_weights_is_written_on_twice_the_threads(device, monkeypatch):
    """loader.BIG_UPLOAD: a gigabyte of weights goes up on twice the threads (small packages gain
    nothing from more), but in a background load (the host's frames first)."""
    from meganeura.runtime import loader as loader_module

    seen, real = [], loader_module.load_calls

    def spy(calls, threads=None, *rest):
        first = next(iter(calls.values()), (None,))[0]
        if getattr(first, "__name__", "") == "_write_counted":
            seen.append(threads)
        return real(calls, threads, *rest)
    monkeypatch.setattr(loader_module, "load_calls", spy)
    package = Package.from_bytes(_mlp(9))
    x = np.ones((4, 16), np.float32)
    with Session(device, package) as s:
        small, small_threads = s.run("infer", {"x": x})["y"], s.upload_threads
    monkeypatch.setattr(loader_module, "BIG_UPLOAD", 1)  # (every package a big one)
    with Session(device, package) as s:
        big, big_threads = s.run("infer", {"x": x})["y"], s.upload_threads
    assert seen == [small_threads, big_threads] == [loader_module.UPLOAD_THREADS, 2 * loader_module.UPLOAD_THREADS]
    np.testing.assert_array_equal(big, small)
    background = Session.load_in_background(device, package, threads=2).result(timeout=120)
    assert background.upload_threads == loader_module.UPLOAD_THREADS  # (the host's frames first)
    background.close()

"""A Session made from a path maps the file and checks the weights while the pipelines compile
and the weights upload (Package._open): the same package as Package.load's, damage anywhere
still refused before the Session exists, and checked again by each Session that uploads them."""
import copy
import os

import numpy as np
import pytest
from meganeura.compiler import Builder, compile_model
from meganeura.runtime import Package, PackageError, Session
from meganeura.runtime import package as package_module
from meganeura.runtime.gpu_objects import GpuObjects
from meganeura.runtime.threads import FileReader

posix_only = pytest.mark.skipif(os.name != "posix", reason="files are mapped on POSIX only (Windows reads them)")

@pytest.fixture(scope="module")
def three_chunks():
    """A package whose 36 MB weight spans three 16 MiB checksum chunks."""
    rng = np.random.default_rng(3)
    b = Builder()
    x = b.input("x", (2, 3000))
    w = (rng.standard_normal((3000, 3000)) / 50).astype(np.float32)
    b.output("y", b.matmul(x, b.param("w", w)) + b.param("c", np.float32(0.5)))
    return compile_model(b.build()), w


@pytest.mark.parametrize("big", [False, True])
def test_a_session_from_a_path_runs_as_one_from_a_loaded_package(big, device, three_chunks, tmp_path, monkeypatch):
    """`big`: as a gigabyte of weights loads (buffers and upload on a thread from the start)."""
    from meganeura.runtime import loader as loader_module

    data, w = three_chunks
    path = tmp_path / "p.mnpk"
    path.write_bytes(data)
    monkeypatch.setattr(package_module, "READ_STEP", 3 << 20)  # several reads on threads per part
    monkeypatch.setattr(loader_module, "BIG_UPLOAD", 0 if big else loader_module.BIG_UPLOAD)
    x = np.random.default_rng(4).standard_normal((2, 3000)).astype(np.float32)
    from_path = Session(device, path)
    assert from_path.upload_threads == loader_module.UPLOAD_THREADS * (2 if big else 1)
    assert from_path.package.manifest == Package.from_bytes(data).manifest
    assert not from_path.package.weights["w"].flags.writeable
    np.testing.assert_array_equal(from_path.package.weights["w"], Package.load(path).weights["w"])
    assert from_path.package.weights["c"].shape == ()  # safetensors' [1] as the manifest's scalar
    got = from_path.run("infer", {"x": x})["y"]
    want = Session(device, Package.load(path)).run("infer", {"x": x})["y"]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, x.astype(np.float64) @ w.astype(np.float64) + 0.5, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("where", ["header chunk", "middle chunk", "last chunk"])
def test_damaged_weights_are_refused_from_a_path(device, three_chunks, tmp_path, where, monkeypatch):
    data, _ = three_chunks
    damaged = bytearray(data)
    man_len = int.from_bytes(data[12:20], "little")
    at = {"header chunk": 28 + man_len + 100, "middle chunk": 28 + man_len + (20 << 20), "last chunk": -32 - 1000}
    damaged[at[where]] ^= 0x10
    monkeypatch.setattr(package_module, "READ_STEP", 1 << 20)  # (Package.load's reads: 1 MiB on threads)
    path = tmp_path / "p.mnpk"
    path.write_bytes(bytes(damaged))
    # checked on threads (the header chunk first): the Session is not returned before they pass
    span = {"header chunk": "0-16777216", "middle chunk": "16777216-33554432", "last chunk": r"33554432-\d+"}[where]
    with pytest.raises(PackageError, match=rf"damaged weights: bytes {span} of the weights blob"):
        Session(device, path)
    with pytest.raises(PackageError, match="damaged weights"):
        Package.load(path)


def test_a_file_cut_short_while_read_is_named(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 5000)
    view = memoryview(bytearray(8000))
    with open(path, "rb") as f:
        reader = FileReader(f, 8000, lambda why: PackageError(f"cannot read package f: {why}"))
        # (the three reads past the end run on threads: whichever fails first is named)
        with pytest.raises(PackageError, match="the file ended at byte [567]000 of 8000 while being read"):
            reader.into(view, 0, 0, 8000, step=1000)
        reader.into(view, 1000, 0, 4000, step=999)
    assert bytes(view[:4000]) == b"x" * 4000


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(PackageError, match="cannot read package"):
        Session(None, tmp_path / "nothing.mnpk")


def test_a_file_and_its_bytes_are_judged_alike(tmp_path, monkeypatch):
    """Package.load (head checked, the rest read on a thread) and a mapped file against
    from_bytes (all at once), over random damage to a package of 1 KiB checksum chunks whose
    weights' header spans several."""
    import random

    from meganeura.compiler.package import blob

    monkeypatch.setattr(blob, "CHUNK", 1024)
    rng = np.random.default_rng(6)
    b = Builder()
    x = b.input("x", (1, 8))
    for i in range(40):  # a header of 40 entries, over 1 KiB
        x = b.relu(b.matmul(x, b.param(f"layer_{i:02d}.weight", rng.standard_normal((8, 8)).astype(np.float32))))
    b.output("y", x)
    good = compile_model(b.build())
    man_len = int.from_bytes(good[12:20], "little")
    header = int.from_bytes(good[28 + man_len:36 + man_len], "little")
    assert header > 1024 and len(good) - 28 - man_len - 32 > 4 * 1024
    path = tmp_path / "p.mnpk"
    pick = random.Random(7)
    outcomes = set()
    for case in range(150):
        data = bytearray(good)
        for _ in range(pick.choice((1, 1, 3))):
            data[pick.randrange(28 + man_len, len(data) - 32)] ^= 1 << pick.randrange(8)  # in the weights blob
        path.write_bytes(bytes(data))
        results = []
        # (Package._open: mapped, as a Session made from a path has it)
        for load in (lambda: Package.from_bytes(bytes(data)), lambda: Package.load(path), lambda: Package._open(path)):
            try:
                results.append(load().weights)
            except PackageError:
                results.append(None)
        assert (results[0] is None) == (results[1] is None) == (results[2] is None), case
        if results[0] is not None:
            for name, value in results[0].items():
                np.testing.assert_array_equal(results[1][name], value)
                np.testing.assert_array_equal(results[2][name], value)
        outcomes.add(results[0] is None)
    assert outcomes == {True}  # (every flip in the blob is caught, by its layout or its checksums)



@posix_only
def test_a_mapped_file_replaced_or_written_into(device, three_chunks, tmp_path):
    """A Session's package maps its file: a file replaced by a rename (as `meganeura compile`
    writes one) leaves it the bytes it loaded, and its rebuild uploads them again; a file
    written into in place fails the checks that each new Session makes, by name."""
    data, w = three_chunks
    path = tmp_path / "p.mnpk"
    path.write_bytes(data)
    s = Session(device, path)
    assert s.package._mapping is not None  # (mapped, not read)
    x = np.ones((2, 3000), np.float32)
    want = s.run("infer", {"x": x})["y"]
    (tmp_path / "new.mnpk").write_bytes(data[:-40] + bytes(8) + data[-32:])  # (another package's bytes)
    (tmp_path / "new.mnpk").replace(path)
    np.testing.assert_array_equal(s.rebuild(device).run("infer", {"x": x})["y"], want)
    np.testing.assert_array_equal(s.package.weights["w"], w)
    path.write_bytes(data)
    mapped = Session(device, path)
    with open(path, "r+b") as f:  # one weight's byte changed under the mapping
        f.seek(28 + int.from_bytes(data[12:20], "little") + (20 << 20))
        f.write(b"\x7f")
    with pytest.raises(PackageError, match="damaged weights: bytes 16777216-33554432"):
        mapped.rebuild(device)
    with pytest.raises(PackageError, match="damaged weights"):  # (not served once a check has failed)
        mapped.package.weights  # noqa: B018
    with pytest.raises(PackageError, match="damaged weights"):
        Package.load(path)


@posix_only
def test_a_rebuild_that_fails_mid_upload_stops_its_check(device, three_chunks, tmp_path, monkeypatch):
    """A rebuild of a mapped package whose upload fails stops the check it started (no thread
    left) without spoiling the next one: a later rebuild loads and runs."""
    import threading
    import time
    import zlib

    data, w = three_chunks
    path = tmp_path / "p.mnpk"
    path.write_bytes(data)
    s = Session(device, path)
    crc, real = zlib.crc32, GpuObjects.write
    monkeypatch.setattr(package_module.zlib, "crc32", lambda *a: time.sleep(0.2) or crc(*a))  # checks outlast the upload

    def failing(self, t, value, *rest):
        raise MemoryError("the upload failed")
    monkeypatch.setattr(GpuObjects, "write", failing)
    before = set(threading.enumerate())
    with pytest.raises(MemoryError, match="the upload failed"):
        s.rebuild(device)
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("meganeura-")]
    monkeypatch.setattr(GpuObjects, "write", real)
    x = np.ones((2, 3000), np.float32)
    np.testing.assert_array_equal(s.rebuild(device).run("infer", {"x": x})["y"], s.run("infer", {"x": x})["y"])
    np.testing.assert_array_equal(s.package.weights["w"], w)


def test_a_file_that_cannot_be_mapped_is_read(device, three_chunks, tmp_path, monkeypatch):
    data, w = three_chunks
    path = tmp_path / "p.mnpk"
    path.write_bytes(data)

    def no_mappings(*a, **kw):
        raise OSError("no mappings on this file system")
    monkeypatch.setattr(package_module.mmap, "mmap", no_mappings)
    s = Session(device, path)
    assert s.package._check() is None  # (read into memory, checked then)
    np.testing.assert_array_equal(s.package.weights["w"], w)
    x = np.ones((2, 3000), np.float32)
    np.testing.assert_allclose(s.run("infer", {"x": x})["y"], x.astype(np.float64) @ w.astype(np.float64) + 0.5,
                               rtol=1e-4, atol=1e-4)


def test_a_file_cut_short_before_it_is_mapped_is_named(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 5000)
    with open(path, "rb") as f, pytest.raises(PackageError, match="the file ended at byte 5000 of 8032 while being read"):
        package_module._mapped(f, 100, 8000, path)


def _in_a_child(script: str, data: bytes, tmp_path, *args) -> list:
    """`script` run by a child process (a crash or a signal there must not stop the test run)
    with the package `data` written to its first argument; its output's lines."""
    import subprocess
    import sys

    path = tmp_path / "p.mnpk"
    path.write_bytes(data)
    proc = subprocess.run([sys.executable, "-c", script, str(path), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()


CUT_SHORT = """
import os, sys
from meganeura.runtime import PackageError, Session

path = sys.argv[1]
s = Session(None, path)
with open(path, "r+b") as f:  # cut short in place, under the Session's mapping
    f.truncate(os.path.getsize(path) - (20 << 20))
for what, again in (("rebuild", lambda: s.rebuild(s.device)), ("weights", lambda: s.package.weights)):
    try:
        again()
        print(what, "not refused")
    except PackageError as exc:
        print(what, "refused:", exc)
"""


@posix_only
def test_a_mapped_file_cut_short_is_refused_not_a_crash(three_chunks, tmp_path):
    """A package file cut short in place while a Session maps it: its rebuild and its weights
    raise PackageError instead of reading the missing pages (SIGBUS)."""
    lines = _in_a_child(CUT_SHORT, three_chunks[0], tmp_path)
    assert len(lines) == 2 and all(" refused: cannot read package " in line and "was cut short" in line
                                   for line in lines), lines


INTERRUPTED = """
import signal, sys, threading, time, zlib
from meganeura.runtime import Session
from meganeura.runtime import loader as loader_module

signal.signal(signal.SIGINT, signal.default_int_handler)  # (a job started in the background inherits SIGINT ignored)
path, big = sys.argv[1], sys.argv[2] == "big"
s = Session(None, path)
if big:
    loader_module.BIG_UPLOAD = 0
crc, sent = zlib.crc32, []

def slow(*a):  # the rebuild's check: Ctrl-C arrives while the constructor waits for it
    if not sent:
        sent.append(1)
        time.sleep(0.3)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    time.sleep(0.5)
    return crc(*a)
zlib.crc32 = slow
try:
    s.rebuild(s.device)
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted; left:", sorted(t.name for t in threading.enumerate() if t.name.startswith("meganeura-")))
"""


@posix_only
@pytest.mark.parametrize("big", ["small", "big"])
def test_an_interrupted_rebuild_leaves_no_thread_reading_the_file(big, three_chunks, tmp_path):
    """Ctrl-C while a rebuild waits for its check of the mapped file: the check is stopped
    before KeyboardInterrupt leaves the constructor (on Python 3.10-3.12 an interrupted
    Thread.join() used to let such a thread run on unnoticed)."""
    assert _in_a_child(INTERRUPTED, three_chunks[0], tmp_path, big)[-1] == "interrupted; left: []"


@pytest.mark.parametrize("big", [False, True])
def test_a_file_whose_dispatches_break_the_rules_is_refused_by_a_session(big, device, mlp_training_bytes, tmp_path,
                                                                         monkeypatch):
    """A Session made from a path checks the file's kernels and dispatches after its buffers and
    tensors (`big`: while a gigabyte of weights' buffers are made, Package._check_programs): the
    same PackageError as Package.load's, no thread left behind, and no buffer made but the weights',
    whether the dispatches or the device's limits (workgroup memory) refuse it; out of memory for
    the other buffers, the message counts them all."""
    import random
    import threading

    from meganeura.runtime import GPUOutOfMemoryError
    from meganeura.runtime import loader as loader_module
    from meganeura.runtime.training_state import deferred_buffers
    from test_gpu_faults import FailingDevice
    from test_package_fuzz import CountingDevice, _manifest_mutations, seal, split

    monkeypatch.setattr(loader_module, "BIG_UPLOAD", 0 if big else loader_module.BIG_UPLOAD)
    real_check = loader_module.check_workgroup_memory

    def slow_check(*args):  # (time for an upload thread told too soon to make the other buffers)
        threading.Event().wait(0.05)
        return real_check(*args)
    monkeypatch.setattr(loader_module, "check_workgroup_memory", slow_check)
    m, blob = split(mlp_training_bytes)
    held = {t["buffer"] for t in m["tensors"] if t["init"] == "blob"}
    weights = sum(m["buffers"][i] for i in held)
    before = set(threading.enumerate())
    path, refused = tmp_path / "p.mnpk", 0
    big_kernel = copy.deepcopy(m)  # more workgroup memory than any device has: refused after the dispatches' checks
    for k in big_kernel["kernels"]:
        k["wgsl"] += "\nvar<workgroup> mn_too_big: array<f32, 1000000>;\n"
    for what, mm in [*_manifest_mutations(m, random.Random(11)), ("workgroup memory", big_kernel)]:
        try:
            package_module.check_layout(mm)
        except PackageError:
            continue  # (refused before a Session is made)
        path.write_bytes(seal(mm, blob))
        try:
            package_module.check_programs(mm)
            want = "workgroup memory" if what == "workgroup memory" else None
        except PackageError as exc:
            want = str(exc)
        if want is None:
            continue  # (a mutation the checks allow: the fuzz test runs those)
        counting = CountingDevice(device)
        with pytest.raises(PackageError) as got:
            Session(counting, path)
        assert want in str(got.value), what
        assert counting.bytes <= (weights if big else 0), what
        refused += 1
    assert refused > 30
    path.write_bytes(seal(m, blob))
    now = len(m["buffers"]) - len(deferred_buffers(m))
    with pytest.raises(GPUOutOfMemoryError, match=f"the package needs [0-9.]+ MiB of GPU memory in {now} buffers"):
        Session(FailingDevice(device, len(held) + 1), path)  # (big: the first of the others; else one of the weights')
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("meganeura-")]


@pytest.mark.parametrize("mapped", [True, False])
def test_a_gigabytes_weights_are_written_beside_the_checks_unless_being_read(mapped, device, three_chunks, tmp_path,
                                                                            monkeypatch):
    """A gigabyte of weights at hand (mapped) is written from when its buffers are made, while
    the manifest's kernels and dispatches are checked (slowed here), the other buffers made
    after those checks; one being read (no mappings: Windows) is written once read, the other
    buffers (and so the bind groups) made beside its read (slowed here), not behind it."""
    import threading
    import time
    import zlib

    from meganeura.runtime import loader as loader_module

    data, w = three_chunks
    path = tmp_path / "p.mnpk"
    path.write_bytes(data)
    monkeypatch.setattr(loader_module, "BIG_UPLOAD", 0)
    if not mapped:
        def no_mappings(*a, **kw):
            raise OSError("no mappings on this file system")
        monkeypatch.setattr(package_module.mmap, "mmap", no_mappings)
    crc, checked_end, lock = zlib.crc32, [], threading.Lock()

    def slow_crc(*a):
        time.sleep(0.3 if not mapped else 0)
        out = crc(*a)
        with lock:
            checked_end.append(time.perf_counter())
        return out
    monkeypatch.setattr(package_module.zlib, "crc32", slow_crc)
    check = loader_module.check_workgroup_memory
    monkeypatch.setattr(loader_module, "check_workgroup_memory",
                        lambda *a: time.sleep(0.3 if mapped else 0) or check(*a))
    made, writes, allocate, write = {}, [], GpuObjects.allocate, GpuObjects.write

    def allocate_spy(self, which, what, *rest):
        out = allocate(self, which, what, *rest)
        made[what] = time.perf_counter()
        return out

    def write_spy(self, t, value, *rest):
        writes.append(time.perf_counter())
        return write(self, t, value, *rest)
    monkeypatch.setattr(GpuObjects, "allocate", allocate_spy)
    monkeypatch.setattr(GpuObjects, "write", write_spy)
    s = Session(device, path)
    if mapped:
        assert min(writes) < made["the package"] - 0.2  # (the writes did not wait for the slowed checks)
    else:
        assert made["the package"] < min(writes) and made["the package"] < max(checked_end) - 0.2
    x = np.ones((2, 3000), np.float32)
    np.testing.assert_allclose(s.run("infer", {"x": x})["y"], x.astype(np.float64) @ w.astype(np.float64) + 0.5,
                               rtol=1e-4, atol=1e-4)

"""Weights written at load (runtime/upload.py): through reused staging buffers on GPUs,
one write_buffer per tensor on CPU rasterisers; every byte where the package says."""
import threading

import numpy as np
import pytest
import wgpu

from meganeura.compiler import Builder, compile_model
from meganeura.runtime import DeviceLostError, Package, Session
from meganeura.runtime import upload as upload_module


def _package(sizes, seed=0, weights="f32"):
    """Linear layers whose weight matrices are `sizes` rows of 13 (odd counts of f16 values
    with f16 weights, padded to whole words), each with a bias."""
    rng = np.random.default_rng(seed)
    b = Builder()
    h = b.input("x", (3, 13))
    for i, rows in enumerate(sizes):
        w = b.param(f"l{i}.weight", rng.standard_normal((rows, 13)) / 4)
        y = b.linear(h, w, b.param(f"l{i}.bias", rng.standard_normal(rows)))
        b.output(f"y{i}", y)
    return Package.from_bytes(compile_model(b.build(), weights=weights))


def test_plan_rounds_packs_and_splits():
    rounds = upload_module.plan_rounds([100, 1000, 4, 300], 512)
    got = {}
    for chunks in rounds:
        ends = [at + n for _, _, at, n in chunks]
        assert max(ends) <= 512 and all(at % upload_module.ALIGN == 0 for _, _, at, _ in chunks)
        for index, start, _, n in chunks:
            got.setdefault(index, []).append((start, n))
    for index, size in enumerate([100, 1000, 4, 300]):  # every byte of every write, once, in order
        pieces = got[index]
        assert pieces[0][0] == 0 and sum(n for _, n in pieces) == size
        assert all(a + n == b for (a, n), (b, _) in zip(pieces, pieces[1:]))


@pytest.mark.parametrize("weights", ["f32", "f16"])
def test_weights_through_a_ring_of_small_staging_buffers(weights, device, monkeypatch):
    """Staging buffers of 1 KiB, 3 of them: writes packed, split across rounds, buffers
    reused (mapped again after their copies); every weight reads back exactly."""
    monkeypatch.setattr(upload_module, "RING_FROM_BYTES", 0)
    monkeypatch.setattr(upload_module, "STAGING_BYTES", 1024)
    monkeypatch.setattr(upload_module, "STAGING_COUNT", 3)
    monkeypatch.setattr(upload_module, "PIECE_BYTES", 256)  # big writes spread over the threads
    pkg = _package([7, 61, 130, 5, 33], weights=weights)
    fills = []
    real_fill = upload_module._fill
    monkeypatch.setattr(upload_module, "_fill", lambda *a: fills.append(len(a[3])) or real_fill(*a))
    s = Session(device, pkg, device_class="gpu")
    assert len(fills) > 3  # more rounds than staging buffers: they were reused
    assert weights == "f32" or any(w.dtype == np.float16 and w.size % 2 for w in pkg.weights.values())
    for name, want in pkg.weights.items():
        got = s.read_tensor(name)
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    x = np.random.default_rng(1).standard_normal((3, 13)).astype(np.float32)
    monkeypatch.setattr(upload_module, "RING_FROM_BYTES", 1 << 40)
    ref = Session(device, pkg, device_class="gpu")  # the same package written without the ring
    for k, v in s.run("infer", {"x": x}).items():
        assert np.array_equal(v, ref.run("infer", {"x": x})[k]), k


def test_a_device_lost_during_a_ring_upload(monkeypatch):
    """A device lost while the staging buffers are being filled: DeviceLostError, and no
    upload thread is left behind."""
    monkeypatch.setattr(upload_module, "RING_FROM_BYTES", 0)
    monkeypatch.setattr(upload_module, "STAGING_BYTES", 1024)
    monkeypatch.setattr(upload_module, "STAGING_COUNT", 2)
    pkg = _package([40, 50, 60, 70])
    own = wgpu.gpu.request_adapter_sync().request_device_sync()  # this one gets destroyed
    fills, real_fill = [], upload_module._fill

    def fill(*a):
        fills.append(1)
        if len(fills) == 3:
            own.destroy()
        return real_fill(*a)

    monkeypatch.setattr(upload_module, "_fill", fill)
    with pytest.raises(DeviceLostError, match="uploading the weights"):
        Session(own, pkg, device_class="gpu")
    rounds = upload_module.plan_rounds([w.nbytes for w in pkg.weights.values()], 1024)
    assert 3 <= len(fills) < len(rounds)  # the rounds after the loss never started
    assert not [t for t in threading.enumerate() if t.name.startswith(("meganeura-load", "meganeura-upload"))]

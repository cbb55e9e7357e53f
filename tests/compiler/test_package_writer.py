"""The package writer: the same input gives the same bytes, and what it writes loads back
(manifest, checksums, weights bit for bit) through the runtime's own reader."""
import hashlib
import json
import struct
import sys
import zlib

import numpy as np
import pytest
from meganeura.compiler import Builder, TrainConfig, compile_model
from meganeura.compiler.package import blob
from meganeura.compiler import compile as compile_mod
from meganeura.compiler.compile import compile_programs
from meganeura.compiler.models import unet
from meganeura.compiler.package.writer import PackageBuilder
from meganeura.compiler.passes.prepare import prepare
from meganeura.compiler.passes.schedule import schedule
from meganeura.runtime import Package, PackageError


class _Clock:  # compile_model records its own duration in the manifest: pin it
    @staticmethod
    def perf_counter():
        return 0.0


def _model():
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (3, 5))
    h = b.relu(b.linear(x, b.param("l1.weight", rng.standard_normal((7, 5)).astype(np.float32)),
                        b.param("l1.bias", rng.standard_normal(7).astype(np.float32))))
    y = b.linear(h, b.param("l2.weight", rng.standard_normal((2, 7))))
    b.output("y", b.op("add", y, b.constant(np.linspace(0, 1, 6).reshape(3, 2))))  # float64: stored as f32
    return b.build()


def test_same_model_gives_identical_bytes(monkeypatch):
    monkeypatch.setattr(compile_mod, "time", _Clock)
    cfg = TrainConfig(loss="mse", optimizer="adamw")
    assert compile_model(_model(), cfg) == compile_model(_model(), cfg)
    m = unet.unet(unet.tiny_config())
    assert compile_model(m, cfg) == compile_model(m, cfg)
    assert compile_programs({"infer": m.graph}) == compile_programs({"infer": m.graph})


def test_weights_round_trip_exactly():
    model = _model()
    pkg = Package.from_bytes(compile_model(model, TrainConfig(loss="mse", optimizer="adamw", lr=0.125)))
    for name, value in model.params.items():
        got = pkg.weights[name]
        assert got.dtype == np.float32 and got.shape == value.shape
        assert np.array_equal(got, np.asarray(value, np.float32)), name
    assert float(pkg.weights["optimizer.lr"]) == 0.125
    (const,) = [k for k in pkg.weights if k.startswith("constant.")]
    assert np.array_equal(pkg.weights[const], np.linspace(0, 1, 6).reshape(3, 2).astype(np.float32))
    # all-zero optimizer state is not stored: the runtime zero-fills it
    assert not any(k.startswith("optimizer.l1") for k in pkg.weights)


def test_copies_split_into_many_chunks_land_in_place(monkeypatch):
    monkeypatch.setattr(blob, "COPY", 24)  # every array split, copies racing over threads
    monkeypatch.setattr(blob, "CHUNK", 1024)  # and checksummed in pieces across arrays
    model = _model()
    pkg = Package.from_bytes(compile_model(model))
    for name, value in model.params.items():
        assert np.array_equal(pkg.weights[name], np.asarray(value, np.float32)), name


def test_a_blob_hashed_early_but_then_different_is_hashed_again():
    model = _model()
    other = _model()
    other.graph.values["l1.bias"] = np.full(7, 3.0, np.float32)  # not what was predicted
    pb = PackageBuilder("test")
    pb.start_blob_hash([prepare(model.graph)])
    pb.add_program("infer", schedule(prepare(other.graph)))
    pkg = Package.from_bytes(pb.write({"source": {}, "batch": None}))
    assert np.array_equal(pkg.weights["l1.bias"], np.full(7, 3.0, np.float32))
    # and with the prediction right, the same bytes as without one
    pb1, pb2 = PackageBuilder("test"), PackageBuilder("test")
    g = prepare(model.graph)
    pb1.start_blob_hash([g])
    for pb in (pb1, pb2):
        pb.add_program("infer", schedule(g))
    assert pb1.write({}) == pb2.write({})


def _crcs(data: bytes) -> bytes:
    return b"".join(struct.pack(">I", zlib.crc32(data[o:o + blob.CHUNK])) for o in range(0, len(data), blob.CHUNK))


def test_package_bytes_layout():
    arrays = {"b": np.arange(5, dtype=np.int32), "a": np.linspace(0, 1, 300, dtype=np.float32).reshape(3, 100)}
    b = blob.Blob(arrays)
    out = blob.package_bytes(lambda crcs: b"HEAD" + crcs, b, lambda head: hashlib.sha256(head).digest())
    assert isinstance(out, bytes) and sys.getrefcount(out) == 2  # ours alone (plus getrefcount's argument)
    blob_bytes = out[8:-32]
    assert out[4:8] == _crcs(blob_bytes) and len(blob_bytes) == b.length
    assert out[-32:] == hashlib.sha256(out[:8]).digest()
    (n,) = struct.unpack_from("<Q", blob_bytes)
    header = json.loads(blob_bytes[8:8 + n])
    assert list(header) == ["a", "b"]  # (4-byte arrays, by name), data in the same order
    data = blob_bytes[8 + n:]
    assert data == arrays["a"].tobytes() + arrays["b"].tobytes()


@pytest.mark.parametrize("reserve", [0, 80 << 20, 40 << 20, 30 << 20])
def test_chunk_checksums_span_arrays_and_a_reservation_fits_itself_to_the_package(reserve):
    """Three chunks, two of them cut across arrays; the package's bytes reserved larger,
    smaller (grown in place or moved) or not at all give the same package."""
    rng = np.random.default_rng(0)
    arrays = {"a": rng.standard_normal(3_000_000).astype(np.float32), "b": rng.standard_normal(17).astype(np.float32),
              "c": rng.standard_normal(6_000_000).astype(np.float32)}
    b = blob.Blob(arrays)
    r = blob.Reservation(reserve)
    out = blob.package_bytes(lambda crcs: b"H" * 13 + crcs, b, lambda head: b"T" * 5, r)
    r.release()
    body = out[13 + 4 * 3:-5]
    assert len(body) == b.length and len(out) == 13 + 12 + b.length + 5 and out.endswith(b"TTTTT")
    assert out[13:25] == _crcs(body) and len(_crcs(body)) == 12
    n = struct.unpack_from("<Q", body)[0]
    assert body[8 + n:] == arrays["a"].tobytes() + arrays["b"].tobytes() + arrays["c"].tobytes()
    assert sys.getrefcount(out) == 2


def test_a_damaged_chunk_of_weights_is_named():
    rng = np.random.default_rng(1)
    b = Builder()
    x = b.input("x", (2, 3000))
    w = b.param("w", rng.standard_normal((3000, 3000)).astype(np.float32))  # 36 MB: three chunks
    b.output("y", b.matmul(x, w))
    data = bytearray(compile_model(b.build()))
    assert Package.from_bytes(bytes(data)).weights["w"].shape == (3000, 3000)
    data[-32 - 1000] ^= 0x10  # in the last chunk
    with pytest.raises(PackageError, match=r"damaged weights: bytes 33554432-\d+ of the weights blob"):
        Package.from_bytes(bytes(data))


def test_head_whose_length_depends_on_the_checksums_is_refused():
    b = blob.Blob({"w": np.ones(4, np.float32)})
    with pytest.raises(AssertionError):
        blob.package_bytes(lambda crcs: crcs.strip(b"\0"), b, lambda head: b"")


def test_switch_interval_is_restored_after_hashing():
    import sys

    before = sys.getswitchinterval()
    blobs = [blob.Blob({"w": np.ones(1 << 16, np.float32)}) for _ in range(3)]
    for b in blobs:
        b.start_checksums()
    assert len({b.checksums() for b in blobs}) == 1
    assert sys.getswitchinterval() == before


def test_compiles_pause_the_cycle_collector_and_restore_its_state(monkeypatch):
    import gc

    seen = []
    real_schedule = compile_mod.schedule
    monkeypatch.setattr(compile_mod, "schedule",
                        lambda g, o, *a: seen.append(gc.isenabled()) or real_schedule(g, o, *a))
    assert gc.isenabled()
    compile_model(_model(), TrainConfig(loss="mse", optimizer="sgd"))
    assert seen == [False, False] and gc.isenabled()
    def failing(g, o, *a):
        raise RuntimeError("a compiler bug")
    monkeypatch.setattr(compile_mod, "schedule", failing)
    with pytest.raises(RuntimeError):
        compile_model(_model(), TrainConfig(loss="mse", optimizer="sgd"))
    assert gc.isenabled()  # back on after an error too
    gc.disable()
    try:
        with pytest.raises(RuntimeError):
            compile_model(_model(), TrainConfig(loss="mse", optimizer="sgd"))
        assert not gc.isenabled()  # a caller's own choice survives, errors included
    finally:
        gc.enable()


def test_bytes_do_not_depend_on_how_temps_are_numbered(monkeypatch):
    """Temp buffers are numbered per schedule: two temps of one size and first use (an
    attention gradient's dK and dV partial sums) must pack by their order, not by how their
    numbers spell (temp 100 before temp 99 as text)."""
    import itertools

    from meganeura import __version__
    from meganeura.compiler.ir import ops_layers
    from meganeura.compiler.ir.autodiff import gradients
    from meganeura.compiler.options import CompileOptions
    from meganeura.compiler.package.writer import PackageBuilder

    monkeypatch.setattr(ops_layers, "SCORES_IN_MEMORY_MAX", 0)  # the fused kernels
    monkeypatch.setattr(ops_layers, "SCORES_PARAM_SHARE", 0)
    options = CompileOptions().replace(attention_backward={"fill": 1 << 20, "min_blocks": 1})  # chunked: partials

    def build():
        b = Builder()
        ins = {n: b.input(n, (1, 2, 40, 8)) for n in "qkv"}
        o = b.attention(ins["q"], ins["k"], ins["v"])
        ct = b.input("ct", o.shape)
        grads = gradients(b.e, b.sum(o * ct).id, [ins[n].id for n in "qkv"])
        b.output("o", o)
        b.g.outputs.update({"g" + n: grads[ins[n].id] for n in "qkv"})
        return b.g
    seen = set()
    for start in [*range(1, 14), *range(88, 102)]:  # numbers about to pass 10 and 100
        sched = schedule(prepare(build(), options), options)
        sched.temps = itertools.count(start)
        pb = PackageBuilder(__version__, options)
        pb.add_program("infer", sched)
        seen.add(hashlib.sha256(pb.write({"source": {}, "batch": None})).hexdigest())
    assert len(seen) == 1

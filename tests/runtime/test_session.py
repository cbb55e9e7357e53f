"""Session: running, recording into the host's encoder, readback without stalls, weights."""
import time

import numpy as np
import pytest

from meganeura.compiler import Builder, TrainConfig, compile_model, run_graph
from meganeura.compiler.ir.training import build_training_graph
from meganeura.runtime import Package, Session


def mlp(batch=16, seed=0):
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.input("x", (batch, 12))
    h = b.gelu(b.linear(x, b.param("fc1.weight", rng.standard_normal((20, 12)) * 0.3),
                        b.param("fc1.bias", rng.standard_normal(20) * 0.1)))
    b.output("logits", b.linear(h, b.param("fc2.weight", rng.standard_normal((7, 20)) * 0.3),
                                b.param("fc2.bias", rng.standard_normal(7) * 0.1)))
    return b.build()


@pytest.fixture(scope="module")
def model():
    return mlp()


@pytest.fixture(scope="module")
def package(model):
    return Package.from_bytes(compile_model(model, TrainConfig(optimizer="adamw", lr=0.01)))


def rel(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def test_train_steps_match_the_interpreter(device, model, package):
    session = Session(device, package)
    tg = build_training_graph(model.graph, TrainConfig(optimizer="adamw", lr=0.01))
    rng = np.random.default_rng(1)
    values = {}
    for step in range(4):
        x = rng.standard_normal((16, 12)).astype(np.float32)
        y = rng.integers(0, 7, 16)
        got = session.run("train_step", {"x": x, "labels": y})
        ref, assigned = run_graph(tg, {"x": x, "labels": y, "__row_mask": np.ones(16)}, np.float64, values)
        values.update(assigned)
        assert rel(got["loss"], ref["loss"]) < 1e-4, step
    for name, w in session.weights().items():
        assert rel(w, values[name]) < 1e-4, name


def test_partial_batch_is_masked_and_large_infer_batch_is_split(device, model, package):
    session = Session(device, package)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((37, 12)).astype(np.float32)  # more than two compiled batches
    ref = run_graph(model.graph, {"x": np.concatenate([x[:16]])}, np.float64)[0]["logits"]
    out = session.run("infer", {"x": x})["logits"]
    assert out.shape == (37, 7)
    assert rel(out[:16], ref) < 1e-4
    ref_tail = run_graph(model.graph, {"x": np.concatenate([x[32:], np.zeros((11, 12))])}, np.float64)[0]["logits"]
    assert rel(out[32:], ref_tail[:5]) < 1e-4
    # a partial training batch equals the interpreter with the padded rows masked out
    tg = build_training_graph(model.graph, TrainConfig(optimizer="adamw", lr=0.01))
    y = rng.integers(0, 7, 5)
    before = session.weights()
    got = session.run("train_step", {"x": x[:5], "labels": y})["loss"]
    mask = np.r_[np.ones(5), np.zeros(11)]
    pad_x = np.concatenate([x[:5], np.zeros((11, 12))])
    pad_y = np.r_[y, np.zeros(11, int)]
    ref = run_graph(tg, {"x": pad_x, "labels": pad_y, "__row_mask": mask}, np.float64, before)[0]["loss"]
    assert rel(got, ref) < 1e-4
    with pytest.raises(ValueError, match="compiled for batches of 16"):
        session.run("train_step", {"x": x, "labels": rng.integers(0, 7, 37)})


def test_bad_inputs_get_clear_errors(device, package):
    session = Session(device, package)
    x = np.zeros((16, 12), np.float32)
    with pytest.raises(ValueError, match="missing inputs.*labels"):
        session.run("train_step", {"x": x})
    with pytest.raises(ValueError, match="unknown inputs"):
        session.run("infer", {"x": x, "y": x})
    with pytest.raises(ValueError, match=r"input 'x' has shape \[16, 11\]"):
        session.run("infer", {"x": np.zeros((16, 11))})
    with pytest.raises(TypeError, match="integers.*0.5 at index \\(3,\\)"):  # floats convert only when whole
        session.run("train_step", {"x": x, "labels": np.where(np.arange(16) == 3, 0.5, 1.0)})
    session.run("train_step", {"x": x, "labels": np.ones(16, np.float32)})
    with pytest.raises(KeyError, match="no program 'train'"):
        session.run("train", {"x": x})
    for dtype in (np.int8, np.uint8, np.int16, np.int64, np.uint32):  # any integer dtype
        assert np.isfinite(session.run("train_step", {"x": x, "labels": np.arange(16).astype(dtype) % 7})["loss"])


def test_save_and_load_weights_by_source_names(device, package, tmp_path):
    from safetensors.numpy import load_file

    session = Session(device, package)
    rng = np.random.default_rng(3)
    for _ in range(2):
        session.run("train_step", {"x": rng.standard_normal((16, 12)), "labels": rng.integers(0, 7, 16)})
    session.save_weights(tmp_path / "w.safetensors")
    saved = load_file(str(tmp_path / "w.safetensors"))
    assert sorted(saved) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    fresh = Session(device, package)
    x = rng.standard_normal((16, 12)).astype(np.float32)
    assert rel(fresh.run("infer", {"x": x})["logits"], session.run("infer", {"x": x})["logits"]) > 1e-3
    fresh.load_weights(tmp_path / "w.safetensors")
    assert rel(fresh.run("infer", {"x": x})["logits"], session.run("infer", {"x": x})["logits"]) < 1e-6
    bad = dict(saved)
    bad["fc1.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="fc1.weight"):
        fresh.set_weights(bad)
    assert rel(fresh.weights()["fc2.bias"], saved["fc2.bias"]) == 0  # a failed load changed nothing


def test_record_into_host_encoder_and_readback_never_waits(device, model, package):
    session = Session(device, package)
    x = np.random.default_rng(4).standard_normal((16, 12)).astype(np.float32)
    ref = session.run("infer", {"x": x})["logits"]
    rb = session.readback("infer", "logits", depth=2)
    got, frames, worst = None, 0, 0.0
    while got is None and frames < 500:
        t = time.perf_counter()
        session.write_inputs("infer", {"x": x})
        enc = device.create_command_encoder()
        half = session.dispatch_count("infer") // 2
        session.record(enc, "infer", 0, half)  # a program split across two passes
        session.record(enc, "infer", half)
        rb.record(enc)
        device.queue.submit([enc.finish()])
        rb.submitted()
        got = rb.poll()
        worst = max(worst, time.perf_counter() - t)
        frames += 1
    assert got is not None
    assert rel(got[1], ref) < 1e-6
    assert 1 <= got[0] <= frames and rb.pending <= 2
    # with both slots in flight, record() skips instead of waiting
    for _ in range(3):
        enc = device.create_command_encoder()
        rb.record(enc)
        device.queue.submit([enc.finish()])
        rb.submitted()
    assert rb.skipped >= 1


def test_raw_encoding_matches_the_public_calls_and_still_reports_errors(device, package, monkeypatch):
    """record() calls wgpu-native's C entry points directly (3x less CPU per dispatch); the
    weights after two training steps equal those of wgpu-py's public calls bit for bit,
    and an invalid dispatch still raises from the pass's end()."""
    import wgpu

    from meganeura.runtime import native

    assert native.raw() is not None  # wgpu-py 0.32's layout: the fast path is live
    rng = np.random.default_rng(3)
    batch = {"x": rng.standard_normal((16, 12)).astype(np.float32),
             "labels": rng.integers(0, 7, 16).astype(np.int32)}
    weights = []
    for raw in (native._RAW_CALLS, None):
        monkeypatch.setattr(native, "_RAW_CALLS", raw)
        s = Session(device, package)
        for _ in range(2):
            s.run("train_step", batch)
        weights.append(s.weights())
    for name, value in weights[0].items():
        np.testing.assert_array_equal(value, weights[1][name], err_msg=name)

    monkeypatch.setattr(native, "_RAW_CALLS", native.raw_calls())
    s = Session(device, package)
    pipeline, group, _, p, g = s.programs["infer"][0]
    s.programs["infer"][0] = (pipeline, group, (1 << 24, 1, 1), p, g)  # past every device's limit
    with pytest.raises(wgpu.GPUValidationError):
        enc = device.create_command_encoder()
        s.record(enc, "infer")
        enc.finish()


def test_kernels_without_shader_checks_compute_the_same(device, package):
    """shader_checks=False (wgpuDeviceCreateShaderModuleTrusted, no clamps or loop bounds):
    the same numbers for inference and three training steps, bit for bit; rebuild keeps it;
    WGSL is still validated."""
    sessions = [Session(device, package), Session(device, package, shader_checks=False)]
    assert not sessions[1].rebuild(device).shader_checks
    rng = np.random.default_rng(5)
    for _ in range(3):
        feed = {"x": rng.standard_normal((16, 12)), "labels": rng.integers(0, 7, 16)}
        a, b = (s.run("train_step", feed) for s in sessions)
        np.testing.assert_array_equal(a["loss"], b["loss"])
    x = rng.standard_normal((16, 12))
    np.testing.assert_array_equal(*(s.run("infer", {"x": x})["logits"] for s in sessions))
    from meganeura.runtime.native import unchecked_module as _unchecked_module

    with pytest.raises(Exception, match="Validation"):
        _unchecked_module(device, "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }", "bad")


def test_cpu_variants_only_where_subgroups_are_8_lanes(device, package):
    """The CPU rasterisers' kernels broadcast within 8-lane subgroups: lavapipe on 256-bit SIMD
    (the CI's) runs them, its subgroups 8 lanes wide as its name says; a device without the
    subgroup feature runs the GPU kernels (the same numbers), and refuses device_class='cpu'."""
    from meganeura.runtime.device import runs_cpu_variants

    if "llvmpipe" in device.adapter.info["device"] and "256 bits" in device.adapter.info["device"]:
        assert runs_cpu_variants(device) and Session(device, package).device_class == "cpu"
    if runs_cpu_variants(device):
        assert _subgroup_size(device) == 8
    plain = device.adapter.request_device_sync(required_features=[])
    assert "subgroup" not in plain.features and not runs_cpu_variants(plain)
    s = Session(plain, package)
    assert s.device_class == "gpu"
    x = np.random.default_rng(2).standard_normal((16, 12))
    np.testing.assert_allclose(s.run("infer", {"x": x})["logits"], Session(device, package).run("infer", {"x": x})["logits"],
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="device_class='cpu' needs .*subgroup"):
        Session(plain, package, device_class="cpu")


def _subgroup_size(device) -> int:
    """The subgroup size a one-invocation kernel sees on `device`."""
    import wgpu

    buf = device.create_buffer(size=16, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    code = ("@group(0) @binding(0) var<storage, read_write> out: array<u32>;\n@compute @workgroup_size(1)\n"
            "fn main(@builtin(subgroup_size) lanes: u32) { out[0] = lanes; }")
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": device.create_shader_module(code=code),
                                                                      "entry_point": "main"})
    group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                     entries=[{"binding": 0, "resource": {"buffer": buf}}])
    enc = device.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipeline)
    cp.set_bind_group(0, group)
    cp.dispatch_workgroups(1)
    cp.end()
    device.queue.submit([enc.finish()])
    return int(np.frombuffer(device.queue.read_buffer(buf, size=4), np.uint32)[0])


def test_workgroup_memory_beyond_the_device_is_refused_by_name(device):
    """A host's device may allow less workgroup memory than the kernels use (WebGPU's default
    is 16 KiB): the kernels of the device's class are checked, and a smaller device gets a
    clear PackageError before any GPU object is made, not a shader compile error."""
    from meganeura.compiler import Builder, compile_model
    from meganeura.runtime import Package, PackageError, Session
    from meganeura.runtime.package import workgroup_bytes

    b = Builder()
    b.output("c", b.matmul(b.input("a", (300, 64)), b.input("b", (64, 300))))
    pkg = Package.from_bytes(compile_model(b.build()))
    need = max(workgroup_bytes(k["wgsl"]) or 0 for k in pkg.manifest["kernels"] if "(cpu)" not in k["label"])
    assert need >= 4096

    class SmallDevice:
        def __init__(self, device):
            self._device = device
            self.limits = {**device.limits, "max-compute-workgroup-storage-size": need // 2}

        def create_buffer(self, **kw):
            raise AssertionError("no buffer before the checks")

        def create_bind_group_layout(self, **kw):
            raise AssertionError("no layout before the checks")

        def __getattr__(self, name):
            return getattr(self._device, name)

    with pytest.raises(PackageError, match=r"bytes of workgroup memory; this device allows .*required_limits"):
        Session(SmallDevice(device), pkg, device_class="gpu")
    # sized as WebGPU does (each variable rounded up to 16 bytes), however it is spelled
    assert workgroup_bytes("var<workgroup> x: array<vec3<f32>, 10>; var<workgroup> y: array<u32, 3u>;") == 176
    assert workgroup_bytes("var <workgroup> t: array<f32, 1000000>;") == 4_000_000
    assert workgroup_bytes("var< workgroup > t : array< vec4f , 0x10 >; var<workgroup> s: f32;") == 272
    assert workgroup_bytes("// var<workgroup> x: array<f32, 1>;\nvar<workgroup>t:array<f32,1000>;") == 4000
    # arrays of arrays (a [k][group] tile), each element a stride apart (its size rounded up to its alignment)
    assert workgroup_bytes("var<workgroup> t: array<array<vec4<f32>, 32>, 8>;") == 4096
    assert workgroup_bytes("var<workgroup> t: array<array<vec3<f32>, 2>, 3u>;") == 96
    assert workgroup_bytes("var<workgroup> t: array<array<f32, 3>, 5>;") == 64
    for unsized in ("const N = 99999u; var<workgroup> t: array<f32, N>;", "alias A = array<f32, 4>; var<workgroup> t: A;",
                    "var<workgroup> t: array<atomic<u32>, 8>;"):
        assert workgroup_bytes(unsized) is None, unsized
    with pytest.raises(PackageError, match="cannot size"):
        Session(device, Package(_with_kernel_text(pkg.manifest, "var<workgroup> t: array<f32, N>;"), pkg.weights),
                device_class="gpu")


def _with_kernel_text(manifest, extra):
    """The manifest with `extra` WGSL appended to every kernel (a hostile package's)."""
    return dict(manifest, kernels=[dict(k, wgsl=k["wgsl"] + "\n" + extra) for k in manifest["kernels"]])

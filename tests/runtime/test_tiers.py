"""runtime/tiers.py: Session(quick_start=True) runs the quick tier's kernels first (few, cheap to
compile) and the tuned ones once they have compiled behind it; both compute the same."""
import threading

import numpy as np
import pytest
from meganeura.compiler import TrainConfig, compile_model, run_graph
from meganeura.compiler.ir.training import build_training_graph
from meganeura.runtime import Package, PackageError, Session
from meganeura.runtime.package import QUICK, kernels_of

CONFIG = TrainConfig(loss="mse", optimizer="adamw", lr=1e-2)


@pytest.fixture
def cnn(cnn_with_size_variants):
    model, inputs = cnn_with_size_variants
    return model, inputs, Package.from_bytes(compile_model(model, CONFIG))


def _steps(session, inputs, n=3):
    return [float(session.run("train_step", inputs)["loss"]) for _ in range(n)]


def _interpreter_losses(model, inputs, n=3):
    """The first n training losses by the float64 interpreter (compiler/ir/interpret.py)."""
    tg = build_training_graph(model.graph, CONFIG)
    values, losses = {}, []
    for _ in range(n):
        ref, assigned = run_graph(tg, {**inputs, "__row_mask": np.ones(2)}, np.float64, values)
        values.update(assigned)
        losses.append(float(ref["loss"]))
    return losses


def test_the_quick_tier_trains_like_the_tuned_one_and_the_interpreter(device, hold_tuned, cnn):
    model, inputs, pkg = cnn
    m = pkg.manifest
    quick = kernels_of(m, QUICK)
    tuned = {d["kernel"] for p in m["programs"].values() for d in p["dispatches"]}
    assert len(quick) < len(tuned)  # fewer pipelines first (and the GEMMs' cheap to compile)
    assert f"a GPU makes {len(tuned)} pipelines (with quick_start first {len(quick)})" in pkg.summary()
    fast = Session(device, pkg, device_class="gpu", quick_start=True)
    assert fast.tier == "quick"
    with pytest.raises(TimeoutError):
        fast.wait_tuned(timeout=0.05)
    plain = Session(device, pkg, device_class="gpu")
    refs = _interpreter_losses(model, inputs)
    got, want = _steps(fast, inputs), _steps(plain, inputs)
    assert fast.tier == "quick"  # (all three steps ran on it)
    np.testing.assert_allclose(got, refs, rtol=1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for name, w in plain.weights().items():
        np.testing.assert_allclose(fast.read_tensor(name), w, rtol=1e-4, atol=1e-6, err_msg=name)
    hold_tuned.set()
    fast.close()
    plain.close()


def test_the_tuned_kernels_take_over_between_recordings(device, hold_tuned, cnn):
    _, inputs, pkg = cnn
    s = Session(device, pkg, device_class="gpu", quick_start=True)
    first = [step[0] for step in s.programs["train_step"]]
    losses = _steps(s, inputs, 2)
    hold_tuned.set()
    s.wait_tuned(timeout=60)
    assert s.tier == "tuned"
    now = [step[0] for step in s.programs["train_step"]]
    assert sum(a is not b for a, b in zip(first, now)) > 0  # the quick GEMMs replaced
    losses += _steps(s, inputs, 2)
    np.testing.assert_allclose(losses, _steps(Session(device, pkg, device_class="gpu"), inputs, 4), rtol=1e-5)
    again = s.rebuild(device)
    assert again.quick_start
    again.close()
    s.close()


def test_closing_while_the_tuned_tier_compiles_stops_it(device, hold_tuned, cnn):
    _, inputs, pkg = cnn
    before = set(threading.enumerate())
    s = Session(device, pkg, device_class="gpu", quick_start=True)
    assert hold_tuned.began.wait(60)  # (its compiles begin once the training step's own have ended)
    threading.Timer(0.2, hold_tuned.set).start()  # the compiles under way finish; the others never start
    s.close()
    assert s.tier == "quick" and s.programs == {}
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith(("meganeura-", "ThreadPool"))]
    with pytest.raises(RuntimeError, match="closed"):
        s.run("train_step", inputs)


def test_a_tuned_kernel_the_compiler_rejects_leaves_the_quick_tier_running(device, cnn):
    """A broken package's error is not lost (a warning, and wait_tuned() raises it), and the
    session it came to goes on with the kernels that work."""
    _, inputs, pkg = cnn
    m = pkg.manifest
    quick = kernels_of(m, QUICK)
    broken = dict(m, kernels=[k if i in quick else dict(k, wgsl=k["wgsl"] + "\nfn broken() { let x: f32 = 1u; }")
                              for i, k in enumerate(m["kernels"])])
    with pytest.warns(RuntimeWarning, match="(?s)tuned kernels were not made .*keeps running its quick tier"):
        s = Session(device, Package(broken, pkg.weights), device_class="gpu", quick_start=True)
        with pytest.raises(PackageError, match="rejected by the WGSL compiler"):
            s.wait_tuned(timeout=60)
    with pytest.raises(PackageError, match="rejected by the WGSL compiler"):  # (each time)
        s.wait_tuned(timeout=60)
    assert s.tier == "quick"
    np.testing.assert_allclose(_steps(s, inputs, 2), _steps(Session(device, pkg, device_class="gpu"), inputs, 2),
                               rtol=1e-5)
    s.close()


def test_a_training_state_that_fails_leaves_the_tuned_tier_whole(device, cnn, training_state_out_of_memory):
    """The training state compiles the kernels only the training step runs in the quick tier;
    one of those that inference runs in the tuned tier (a training dispatch with no quick
    variant of its own) is compiled for the tuned tier too when the training state fails."""
    import copy

    from meganeura.runtime import GPUOutOfMemoryError

    _, inputs, pkg = cnn
    m = copy.deepcopy(pkg.manifest)
    tuned_infer, quick_infer = kernels_of(m, "gpu", ["infer"]), kernels_of(m, QUICK, ["infer"])
    d = next(d for d in m["programs"]["train_step"]["dispatches"]
             if QUICK in d.get("variants", {}) and d["kernel"] in tuned_infer and d["kernel"] not in quick_infer)
    del d["variants"][QUICK]  # its tuned kernel is now a quick kernel only the training step runs
    with Session(device, Package(m, pkg.weights), device_class="gpu", quick_start=True) as s:
        want = s.run("infer", {"x": inputs["x"]})["y"]
        s.wait_tuned(timeout=60)
        assert s.tier == "tuned" and isinstance(s.training_error, GPUOutOfMemoryError)
        np.testing.assert_allclose(s.run("infer", {"x": inputs["x"]})["y"], want, rtol=1e-4, atol=1e-5)
        with pytest.raises(GPUOutOfMemoryError):
            s.run("train_step", inputs)


def test_cpu_rasterisers_run_their_own_kernels_from_the_start(device, cnn):
    _, inputs, pkg = cnn
    s = Session(device, pkg, device_class="cpu", quick_start=True)
    assert s.tier == "tuned" and s._tuned is None
    s.wait_tuned(timeout=0)
    assert np.isfinite(s.run("train_step", inputs)["loss"])


def test_a_background_load_is_done_with_its_quick_tier(device, hold_tuned, cnn):
    _, inputs, pkg = cnn
    loading = Session.load_in_background(device, pkg, quick_start=True, device_class="gpu")
    s = loading.result(timeout=60)
    assert loading.progress == 1.0 and s.tier == "quick"
    want = _steps(Session(device, pkg, device_class="gpu"), inputs, 2)
    got = _steps(s, inputs, 1)
    hold_tuned.set()
    s.wait_tuned(timeout=60)
    np.testing.assert_allclose(got + _steps(s, inputs, 1), want, rtol=1e-5)
    s.close()


def test_gemms_too_wide_for_quick_tiles_keep_their_tuned_kernel(device):
    """A quick GEMM's 16-tiles would need more workgroups than a device allows: that dispatch
    has no quick variant, and the package loads as before (tuned kernel in both tiers)."""
    from meganeura.compiler import Builder

    b = Builder()
    b.output("y", b.matmul(b.input("x", (1030 * 1030, 8)), b.input("w", (8, 4))))
    m = Package.from_bytes(compile_model(b.build())).manifest
    (d,) = m["programs"]["infer"]["dispatches"]
    assert "quick" not in d.get("variants", {}) and "cpu" in d["variants"]
    assert m["requires"]["limits"]["max_compute_workgroups_per_dimension"] <= 65535


def test_bind_groups_wait_for_the_buffers_and_a_cancelled_load_makes_none(device, cnn):
    """make_bind_groups computes its keys at once, makes the groups on its own thread (one
    thread: no pool) only once `allocated` is set, and none after `cancel` is."""
    from meganeura.runtime.tiers import make_bind_groups

    _, _, pkg = cnn
    s = Session(device, pkg)
    assert s.programs  # (the training step's groups made: no other thread makes any below)
    made = []
    objects = s._objects  # (the session's GPU objects: runtime/gpu_objects.py)
    real = objects.bind_group
    objects.bind_group = lambda *a: made.append(threading.current_thread()) or real(*a)
    allocated, cancel = threading.Event(), threading.Event()
    out = {}
    worker = threading.Thread(target=lambda: out.update(
        r=make_bind_groups(objects, pkg.parsed, s.device_class, 1, {}, cancel, allocated)), daemon=True)
    try:
        worker.start()
        worker.join(0.2)
        assert worker.is_alive() and not made  # waiting for the buffers
        allocated.set()
        worker.join(60)
        forms, groups = out["r"]
        assert len(groups) == len(made) > 0 and set(made) == {worker}
        assert all(key in groups for steps in forms.values() for _, key in steps)
        made.clear()
        cancel.set()
        _, none = make_bind_groups(objects, pkg.parsed, s.device_class, 1, {}, cancel)
        assert not made and set(none.values()) == {None}
    finally:
        allocated.set()
        s.close()


def _cnn_with_literal_variants():
    """Convolutions of different paddings, each scaled by its own constant and cut by its own
    slice: kernels that differ only in f32 and typed i32 literals, which the quick tier joins."""
    from meganeura.compiler import Builder

    rng = np.random.default_rng(5)
    b = Builder()
    h, c_in, size = b.input("x", (2, 3, 12, 12)), 3, 12
    for i, (pad, scale, cut) in enumerate([(1, 0.5, 1), (2, 0.25, 2), (1, 0.125, 0)]):
        w = b.param(f"c{i}.weight", (rng.standard_normal((8, c_in, 3, 3)) * 0.3).astype(np.float32))
        h = b.mul(b.relu(b.conv2d(h, w, stride=(1, 1), padding=(pad,) * 4)), b.const(scale))
        size += 2 * pad - 2
        h = b.slice(h, starts=(0, 0, cut, cut), steps=(1, 1, 1, 1), shape=(2, 8, size - 2 * cut, size - 2 * cut))
        size, c_in = size - 2 * cut, 8
    h = b.linear(b.mean(h, axes=(2, 3)), b.param("fc.weight", (rng.standard_normal((5, c_in)) * 0.3).astype(np.float32)))
    b.output("y", h)
    return b.build(), {"x": rng.standard_normal((2, 3, 12, 12)).astype(np.float32),
                       "labels": rng.standard_normal((2, 5)).astype(np.float32)}


def test_the_quick_tier_joins_kernels_differing_in_f32_and_i32_literals(device, hold_tuned):
    model, inputs = _cnn_with_literal_variants()
    pkg = Package.from_bytes(compile_model(model, CONFIG))
    m = pkg.manifest
    quick = kernels_of(m, QUICK)
    texts = [m["kernels"][i]["wgsl"] for i in quick]
    assert any("bitcast<f32>(mn_sizes" in t for t in texts) and any("i32(mn_sizes" in t for t in texts)
    fast = Session(device, pkg, device_class="gpu", quick_start=True)
    plain = Session(device, pkg, device_class="gpu")
    refs = _interpreter_losses(model, inputs)
    np.testing.assert_allclose(fast.run("infer", {"x": inputs["x"]})["y"], plain.run("infer", {"x": inputs["x"]})["y"],
                               rtol=1e-5, atol=1e-6)
    got, want = _steps(fast, inputs), _steps(plain, inputs)
    assert fast.tier == "quick"  # (every step ran on it)
    np.testing.assert_allclose(got, refs, rtol=1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    hold_tuned.set()  # (close() waits for the held compiles)
    fast.close()
    plain.close()

"""FrameScheduler: the budget, training spread over frames, never waiting, no CPU copies, the trace."""
import json
import re
import time

import numpy as np
import pytest
from bridge_helpers import handover_package, read_rgba8
from meganeura.engine_bridge import (
    FrameScheduler,
    PatternScene,
    TensorOverlay,
    TextureInput,
)
from meganeura.runtime import Package, Session

BUDGET_MS = 4.0
H = W = 32


def batches(n, seed=5):
    rng = np.random.default_rng(seed)
    return [{"x": rng.random((H * W, 3), dtype=np.float32), "labels": rng.integers(0, 4, H * W)} for _ in range(n)]


def frame(sched, scene=None, t=None):
    enc = sched.device.create_command_encoder()
    if scene is not None:
        scene.draw(enc, t, pass_kwargs=sched.timed("scene"))
    stats = sched.record(enc)
    sched.submit(enc)
    return stats


def rel(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture(scope="module")
def spread(device, seg_package, tmp_path_factory):
    """Six AdamW steps spread over frames (3 ms budget, chunks of 2 dispatches), inference on a
    fixed CPU-written image every frame in between; then the same six steps in one go."""
    session = Session(device, seg_package)
    x0 = np.random.default_rng(9).random((H * W, 3), dtype=np.float32)
    session.write_inputs("infer", {"x": x0})  # once: the training chunks must not disturb it
    trace = tmp_path_factory.mktemp("trace") / "frames.json"
    # at most 3 chunks a frame: a step always spans frames, however fast the machine is today
    sched = FrameScheduler(session, BUDGET_MS, chunk_dispatches=2, trace=str(trace), max_train_chunks=3)
    rb = sched.readback("logits")
    loss = sched.readback("loss", program="train_step", depth=8)
    data = batches(6)
    sched.train(data)
    sched.warm_up()
    scene = PatternScene(device, (64, 64))
    results, losses = [], []
    while sched.train_active and sched.frame < 400:
        frame(sched, scene, sched.frame * 0.05)
        results.append(rb.poll())
        losses.append(loss.poll())
    for _ in range(3):  # after training: inference only
        frame(sched, scene)
    sched.close()
    # close() waited for the GPU: the newest recorded copy maps at once (a frame whose copy
    # was skipped, every slot being busy, has none to wait for); bounded, never a hang
    latest = max(s.frame for s in rb.slots)
    got, deadline = None, time.monotonic() + 20
    while time.monotonic() < deadline and (got is None or got[0] < latest):
        got = rb.poll() or got
    assert got is not None and got[0] == latest, (got and got[0], latest)
    one_go = Session(device, seg_package)
    one_go_losses = [float(one_go.run("train_step", b)["loss"]) for b in data]
    return {"sched": sched, "session": session, "one_go": one_go, "x0": x0, "last": got, "trace": trace,
            "losses": [v for v in losses if v is not None], "one_go_losses": one_go_losses}


def test_no_frame_passes_the_budget_by_more_than_one_chunk(spread):
    sched = spread["sched"]
    assert sched.timestamps  # lavapipe has timestamp queries: these are GPU measurements
    frames = list(sched.stats)
    measured = [f for f in frames if f.ml_ms is not None]
    assert len(measured) >= 0.8 * len(frames)
    # lavapipe's "GPU" is this CPU: a pass that an OS preemption stalls measures many times
    # what the same dispatches measure in other frames. A stall is a pass over 4x the fastest
    # run of the same chunk + 1 ms; it is capped there (the work cannot explain the rest).
    # A scheduler that packed too much shows up with or without stalls.
    fastest = {}
    for f in measured:
        for p in f.passes:
            fastest[p.key] = min(fastest.get(p.key, np.inf), p.ms)
    stalled = 0
    for f in measured:
        ms = [p.ms for p in f.passes if p.kind == "ml"]
        assert abs(sum(ms) - f.ml_ms) < 1e-9
        if f.ml_ms <= BUDGET_MS + f.max_chunk_ms:
            continue
        stalled += 1
        capped = [min(p.ms, 4 * fastest[p.key] + 1.0) for p in f.passes if p.kind == "ml"]
        assert sum(capped) <= BUDGET_MS + max(capped) + 1e-6, (f.frame, f.ml_ms, f.passes)
    assert stalled <= 0.1 * len(measured), f"{stalled} of {len(measured)} frames stalled"
    # inference every frame; training packed several chunks into some frames, and spread steps over frames
    assert all(any(p.label.startswith("infer[") for p in f.passes) for f in frames)
    assert max(f.train_chunks for f in frames) >= 2
    frames_of_step = {}
    for f in frames:
        for p in f.passes:
            if m := re.search(r"step (\d+)", p.label):
                frames_of_step.setdefault(int(m.group(1)), set()).add(f.frame)
    assert sorted(frames_of_step) == list(range(6))
    assert max(len(v) for v in frames_of_step.values()) >= 2


def test_spread_training_equals_training_in_one_go(spread):
    assert spread["sched"].steps_done == 6
    got, want = spread["session"].weights(), spread["one_go"].weights()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)
    # inference between the chunks kept its own input, and the last readback is the trained model's
    frame_no, logits = spread["last"]
    assert frame_no > spread["sched"].frame - 3  # from the inference-only frames after training
    assert rel(logits, spread["one_go"].run("infer", {"x": spread["x0"]})["logits"]) < 1e-5
    # the loss readback after each step's last chunk: the same losses as the one-go steps
    for step_frame, value in spread["losses"]:
        assert any(abs(float(value) - v) <= 1e-5 * max(1, abs(v)) for v in spread["one_go_losses"])


def test_trace_file_opens_in_perfetto_format(spread):
    trace = json.loads(spread["trace"].read_text())
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and isinstance(e["ts"], (int, float)) and "pid" in e and "tid" in e for e in spans)
    names = {e["name"] for e in spans}
    assert {"infer[0:2]", "scene"} <= names and any(n.startswith("frame ") for n in names)
    assert any(n.startswith("train_step[") for n in names)
    assert any(e["ph"] == "C" and "ml" in e["args"] for e in events)
    assert {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"} == {"CPU", "GPU queue"}
    summary = spread["sched"].summary()
    assert summary["train_steps"] == 6 and summary["render_ms_p50"] > 0 and summary["ml_ms_p50"] > 0


def test_a_frame_never_waits_for_the_gpu(device, seg_package, monkeypatch):
    session = Session(device, seg_package)
    scene = PatternScene(device, (64, 64))
    feed = TextureInput(session, scene.texture, size=(H, W), mean=0.5, std=0.25)
    sched = FrameScheduler(session, BUDGET_MS, before=[feed])
    rb = sched.readback("logits", depth=1)
    sched.warm_up()
    frame(sched, scene, 0.3)  # draws the scene once (its only upload)
    end = time.monotonic() + 10
    while rb.poll() is None and time.monotonic() < end:  # set-up: let the first readback land
        time.sleep(0.001)
    buffer_type = type(session.buffers[0])

    def waits(*args, **kwargs):
        raise AssertionError("the frame loop waited for the GPU")

    monkeypatch.setattr(buffer_type, "map_sync", waits)
    monkeypatch.setattr(device.queue, "read_buffer", waits)
    monkeypatch.setattr(device.queue, "read_texture", waits)
    frame(sched, scene)
    assert rb.pending == 1  # the frame is done; its readback is still on its way
    frame(sched, scene)
    assert rb.skipped == 1  # the only slot is busy: the copy is skipped, nothing waits
    got = None
    for _ in range(500):
        got = rb.poll()
        if got is not None:
            break
        frame(sched, scene)
    assert got is not None
    monkeypatch.undo()
    image = read_rgba8(device, scene.texture)
    want = Session(device, seg_package).run("infer", {"x": feed.reference(image)})["logits"]
    assert rel(got[1], want) < 1e-4


def test_no_cpu_copies_of_model_inputs_and_outputs_per_frame(device, seg_package, monkeypatch):
    session = Session(device, seg_package)
    scene = PatternScene(device, (64, 64))
    feed = TextureInput(session, scene.texture, size=(H, W))
    overlay = TensorOverlay(session, "logits", size=(H, W))
    sched = FrameScheduler(session, BUDGET_MS, chunk_dispatches=8, before=[feed], after=[overlay])
    rb = sched.readback("logits")
    sched.train(batches(2))
    sched.warm_up()
    calls = []
    queue = device.queue
    for name in ("write_buffer", "write_texture", "read_buffer", "read_texture"):
        original = getattr(queue, name)

        def counted(target, *args, _name=name, _original=original, **kwargs):
            calls.append((sched.frame, _name, target))
            return _original(target, *args, **kwargs)

        monkeypatch.setattr(queue, name, counted)
    frames = 0
    while (sched.train_active or frames < 10) and frames < 400:
        frame(sched, scene)  # a static scene: the host uploads nothing either
        rb.poll()
        frames += 1
    monkeypatch.undo()
    held = {id(b) for slot in sched._step_buffers.held for b in slot.buffers.values()}  # the scheduler's own ring
    model_io = {id(session.buffers[feed.tensor.buffer]), id(overlay.source)}
    assert sched.steps_done == 2
    assert all(name == "write_buffer" and id(target) in held for _, name, target in calls), calls
    assert not [c for c in calls if id(c[2]) in model_io]
    assert len(calls) == 2 * 3  # per training step, its batch: x, labels, row mask; nothing per frame
    assert rb.frame == frames and rb.skipped < frames


def test_without_timestamp_queries_cpu_calibrated_estimates_drive_the_budget(device, seg_package):
    session = Session(device, seg_package)
    # at most 3 training chunks a frame: the steps span frames however fast this machine is
    sched = FrameScheduler(session, BUDGET_MS, chunk_dispatches=4, timestamps=False, max_train_chunks=3)
    data = batches(2, seed=7)
    sched.train(data)
    sched.warm_up()  # times every chunk on the CPU clock (submit, then wait) instead
    assert len(sched.costs.calibrated) == len(sched.chunks["infer"]) + len(sched.chunks["train_step"])
    while sched.train_active and sched.frame < 400:
        frame(sched)
    sched.close()
    frames = list(sched.stats)
    assert all(f.ml_ms is None for f in frames) and len(frames) >= 2
    for f in frames:
        est = [p.est for p in f.passes if p.kind == "ml"]
        assert f.ml_est_ms <= BUDGET_MS + max(est) + 1e-9
    one_go = Session(device, seg_package)
    for b in data:
        one_go.run("train_step", b)
    for name, w in one_go.weights().items():
        np.testing.assert_allclose(session.weights()[name], w, rtol=0, atol=1e-6, err_msg=name)


def test_training_on_data_already_on_the_gpu(device, seg_package):
    """Steps whose inputs come from the GPU: x from the scene texture (the same buffer that
    inference reads), labels written by a GPU copy recorded before each step (`prepare`)."""
    import wgpu

    session = Session(device, seg_package)
    scene = PatternScene(device, (64, 64))
    feed = TextureInput(session, scene.texture, size=(H, W), mean=0.5, std=0.3)
    sched = FrameScheduler(session, BUDGET_MS, chunk_dispatches=4, before=[feed])
    labels = np.random.default_rng(3).integers(0, 4, H * W).astype(np.int32)
    source = device.create_buffer_with_data(data=labels, usage=wgpu.BufferUsage.COPY_SRC)
    target = session.buffers[session.package.parsed.programs["train_step"].inputs["labels"].buffer]
    sched.train(None, steps=3, prepare=lambda enc: enc.copy_buffer_to_buffer(source, 0, target, 0, labels.nbytes))
    sched.warm_up()
    frame(sched, scene, 0.7)  # the scene is drawn once; every frame's feed writes the same x
    while sched.train_active and sched.frame < 400:
        frame(sched, scene)
    sched.close()
    assert sched.steps_done == 3
    x = feed.reference(read_rgba8(device, scene.texture))
    one_go = Session(device, seg_package)
    for _ in range(3):
        one_go.run("train_step", {"x": x, "labels": labels})
    for name, w in one_go.weights().items():
        np.testing.assert_allclose(session.weights()[name], w, rtol=0, atol=1e-5, err_msg=name)


def test_a_step_keeps_the_features_inference_handed_over_when_it_started(device):
    """Inference caches features each frame (a state the training program reads); a step
    spread over frames must train on the features of its first frame, not on later ones."""
    package = handover_package()
    session = Session(device, package)
    sched = FrameScheduler(session, 50.0, train="train_head", chunk_dispatches=1, max_train_chunks=1)
    rng = np.random.default_rng(4)
    data = [{"labels": rng.integers(0, 3, 4), "mask": np.array([1, 1, 0, 1], np.float32)} for _ in range(3)]
    sched.train(data)
    xs = {}
    while sched.train_active and sched.frame < 100:
        xs[sched.frame + 1] = rng.standard_normal((4, 5)).astype(np.float32)
        session.write_inputs("infer", {"x": xs[sched.frame + 1]})  # the test's own upload: new features each frame
        frame(sched)
    sched.close()
    starts = {}
    for f in sched.stats:
        for p in f.passes:
            if m := re.search(r"step (\d+)", p.label):
                starts.setdefault(int(m.group(1)), f.frame)
    assert sched.steps_done == 3 and max(starts.values()) - min(starts.values()) >= 3  # steps spanned frames
    one_go = Session(device, package)
    for step, batch in enumerate(data):
        one_go.run("infer", {"x": xs[starts[step]]})
        one_go.run("train_head", batch)
    np.testing.assert_allclose(session.weights()["head.weight"], one_go.weights()["head.weight"], rtol=0, atol=1e-6)


def test_a_package_with_pooled_scratch_gets_a_warning(device):
    """share_scratch packages make the scheduler save and restore every pooled buffer a
    training chunk binds: it says so instead of quietly using more memory."""
    from meganeura.compiler import Builder, TrainConfig, compile_model

    b = Builder()
    b.output("y", b.linear(b.input("x", (4, 3)), b.param("w", np.ones((2, 3))), b.param("c", np.zeros(2))))
    pkg = Package.from_bytes(compile_model(b.build(), TrainConfig(loss="mse"), share_scratch=True))
    with pytest.warns(UserWarning, match="share_scratch"):
        FrameScheduler(Session(device, pkg), 4.0).train(iter(()))


def test_training_waits_for_frames_in_which_the_training_state_exists(device, seg_package, monkeypatch):
    """The training state is made after the load (runtime/training_state.py): a scheduler made and
    told to train before it exists records inference alone, never waiting for it in a frame."""
    import threading

    from meganeura.runtime.training_state import TrainingState

    gate, real = threading.Event(), TrainingState._make
    monkeypatch.setattr(TrainingState, "_make", lambda self, *a: gate.wait(60) and real(self, *a))
    try:
        session = Session(device, seg_package)
        sched = FrameScheduler(session, BUDGET_MS)
        sched.train(batches(1))
        for _ in range(3):
            t = time.perf_counter()
            stats = frame(sched)
            assert time.perf_counter() - t < 5 and stats.chunks > 0 and stats.train_chunks == 0
        assert not session.training_ready and sched.steps_started == 0
    finally:
        gate.set()
    session.programs  # noqa: B018  (the state made)
    while sched.train_active and sched.frame < 400:
        frame(sched)
    assert sched.steps_done == 1


def test_a_training_state_that_cannot_be_made_stops_training_not_the_frames(device, seg_package,
                                                                            training_state_out_of_memory):
    from meganeura.runtime import GPUOutOfMemoryError

    session = Session(device, seg_package)
    sched = FrameScheduler(session, BUDGET_MS)
    rb = sched.readback("logits")
    sched.train(batches(2))
    sched.warm_up()  # (inference alone)
    got = None
    while got is None and sched.frame < 100:
        stats = frame(sched)
        assert stats.train_chunks == 0
        got = rb.poll()
    assert got is not None and np.isfinite(got[1]).all()
    assert not sched.train_active and sched.steps_started == 0
    assert isinstance(session.training_error, GPUOutOfMemoryError)

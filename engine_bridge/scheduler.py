"""FrameScheduler: put a Session's programs into the host's frames, within an ML budget.

Each frame, into the host's command encoder: the texture inputs (`before`), the whole
inference program, its readbacks and overlays (`after`), then training chunks while the
budget (milliseconds of GPU time per frame) remains. Programs are cut into chunks of
`chunk_dispatches` dispatches; every chunk is one compute pass whose GPU time the
timestamp queries measure (results arrive frames later; nothing waits). A chunk's
estimate is the worst of its last four measurements; a chunk never measured runs alone,
as the first training chunk of its frame, so a frame's ML work passes the budget by at
most one chunk. Without timestamp queries the estimates come from warm_up()'s CPU-clock
calibration, or from a per-dispatch cost.

Training steps are spread over frames, and a step keeps its data to itself until its last
chunk (engine_bridge/training_steps.py): inference between chunks sees its own inputs; the step
sees its own; the weights equal those of one-go steps.

    sched = FrameScheduler(session, budget_ms=6, before=[feed], after=[overlay])
    sched.train(batches)            # an iterable of {input name: array}
    sched.warm_up()                 # blocking, before the loop: pipelines' first-run JIT
    while host.poll():
        enc = device.create_command_encoder()
        scene.draw(enc, pass_kwargs=sched.timed("scene"))
        sched.record(enc)
        overlay.composite(enc, host.texture(), background=scene.texture)
        sched.submit(enc); host.present()
    sched.close()                   # waits for the last timings, writes the trace
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np

from .device import has_timestamps, log
from .timing import Costs, FrameStats, GpuTimer, PassStats, Trace
from .training_steps import Step, StepBuffers


class FrameScheduler:
    """Puts a Session's programs into the host's frames, within a budget of GPU milliseconds.

    Args:
        session: the Session whose programs run (on the host's device).
        budget_ms: GPU time per frame for the ML work; inference always runs, training chunks
            fill what it leaves.
        before: passes recorded before inference each frame (e.g. TextureInput).
        after: passes recorded after it (e.g. TensorOverlay).
        infer: the program run every frame; None runs none (training only).
        train: the program that train() runs in chunks.
        chunk_dispatches: dispatches per chunk (one compute pass, timed on its own).
        timestamps: measure chunks with timestamp queries; None: where the device has them.
        trace: a file to write a Chrome trace (chrome://tracing) of the frames to at close().
        history: how many frames summary() covers.
        max_train_chunks: training chunks per frame at most.
        dispatch_ms: a chunk's cost per dispatch before anything is measured.
        timestamp_period_ns: nanoseconds per timestamp tick.
        held_batches: training batches held on the GPU for steps in flight.

    Raises:
        KeyError: no program `infer` in the package.
        ValueError: `chunk_dispatches` below 1, or timestamps asked of a device without them.
    """

    def __init__(self, session, budget_ms: float = 4.0, *, before=(), after=(), infer: str | None = "infer",
                 train: str = "train_step", chunk_dispatches: int = 4, timestamps: bool | None = None,
                 trace=None, history: int = 600, max_train_chunks: int = 64, dispatch_ms: float = 0.05,
                 timestamp_period_ns: float = 1.0, held_batches: int = 3):
        import wgpu

        self._wgpu = wgpu
        self.session, self.device = session, session.device
        self.budget_ms = float(budget_ms)
        self.before, self.after = list(before), list(after)
        programs = session.package.parsed.programs  # (session.programs would wait for the training state)
        if infer is not None and infer not in programs:
            raise KeyError(f"no program {infer!r} in this package")
        self.infer, self.train_program = infer, train if train in programs else None
        if chunk_dispatches < 1:
            raise ValueError("chunk_dispatches must be at least 1")
        self.chunks = {}
        for p in filter(None, (infer, self.train_program)):
            n = session.dispatch_count(p)
            self.chunks[p] = [(i, a, min(a + chunk_dispatches, n)) for i, a in enumerate(range(0, n, chunk_dispatches))]
        self.max_train_chunks = max_train_chunks
        self.timestamps = has_timestamps(self.device) if timestamps is None else bool(timestamps)
        if self.timestamps and not has_timestamps(self.device):
            raise ValueError("this device has no 'timestamp-query' feature")
        self.timer = GpuTimer(self.device, period_ns=timestamp_period_ns) if self.timestamps else None
        self.costs = Costs(dispatch_ms)
        self.trace_path = trace
        self.trace = Trace() if trace else None
        self.stats = deque(maxlen=history)
        self.frame = 0
        self._frame = None
        self._readbacks = {}
        self._fence = self.device.create_buffer(size=8, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        # training
        self.training = False
        self.starved = 0  # frames in which inference alone filled the budget while training waited
        self.steps_started = self.steps_done = 0
        self._batches, self._step, self._step_limit = None, None, None
        self._prepare, self._unset = None, False
        self._step_buffers = None if self.train_program is None else StepBuffers(
            session, self.train_program, self.chunks[self.train_program], held_batches)

    @property
    def train_active(self) -> bool:
        """True while training has batches to run or a step in flight."""
        return self.training or self._step is not None

    # ------------------------------------------------------------- set-up
    def readback(self, output: str, program: str | None = None, depth: int = 3):
        """A runtime Readback of `output`, recorded after `program` each time it completes in a frame.

        Args:
            output: the output's name.
            program: its program; None: the inference program.
            depth: copies in flight at most.

        Returns:
            Readback: its `poll()` gives the newest (frame, array) that arrived, or None.
        """
        program = program or self.infer
        rb = self.session.readback(program, output, depth)
        self._readbacks.setdefault(program, []).append(rb)
        return rb

    def train(self, batches=None, steps: int | None = None, prepare=None) -> None:
        """Run training steps in what the budget leaves of each frame, from the next record() on.

        Args:
            batches: an iterable of {input: array} (a batch smaller than the compiled one is
                padded and masked), or a callable returning one or None (then training ends);
                None: the step's inputs are already on the GPU.
            steps: stop after this many steps; None: when the batches run out.
            prepare: with batches=None, `prepare(encoder)` is recorded before each step's
                first chunk (e.g. a kernel writing labels).

        Raises:
            ValueError: the package has no training program.
        """
        if self.train_program is None:
            raise ValueError("this package has no training program (compile it with a TrainConfig)")
        if callable(batches):
            batches = iter(batches, None)
        limit = None if steps is None else self.steps_started + steps
        self._batches = None if batches is None else iter(batches)
        self._step_limit, self._prepare, self.training = limit, prepare, True
        held = self._step_buffers.ready
        m = self.session.package.parsed
        if not (held or self._unset) and m.plan.shared_scratch and len(m.programs) > 1:
            import warnings

            warnings.warn("this package was compiled with share_scratch=True: every scratch buffer the training "
                          "step binds is saved and restored around its chunks (more memory and copies); "
                          "compile without it for a frame scheduler", stacklevel=2)
        self._unset = batches is None or not held  # (set up in the first frame the training state exists)

    def _set_up(self) -> bool:
        """Training's own buffers, once the session's training state is made (never waits in a frame)."""
        if not self._unset:
            return True
        if not self.session.training_ready:
            return False
        if self.session.training_error is not None:  # (e.g. out of memory): inference runs on alone
            log.warning("training stopped: its state could not be made (%s)", self.session.training_error)
            self.training = False
            return False
        if not self._step_buffers.ready:
            self._step_buffers.set_up()
        if self._batches is None:  # data already on the GPU
            self._step_buffers.count_every_row()
        self._unset = False
        return True

    def warm_up(self, repeats: int = 2) -> None:
        """Blocking; call before the frame loop. Runs every pass `repeats` times: the first run
        of a pipeline pays its JIT (about a second per program on lavapipe); the last run is
        measured. Training runs on whatever its inputs hold; parameters and optimizer state
        are restored afterwards, so training results do not change."""
        s, dev, wgpu = self.session, self.device, self._wgpu
        training = self.train_program is not None
        if training:  # (blocking, as all of warm_up: the training state made; left out if it failed)
            s.programs  # noqa: B018
            training = s.training_error is None
        passes = self._all_passes(training)
        snap = {}
        if training:
            for t in s.package.plan.tensors:
                if t.role in ("param", "state") and t.buffer not in snap:
                    b = s.buffers[t.buffer]
                    snap[t.buffer] = (b, dev.create_buffer(size=b.size, usage=wgpu.BufferUsage.COPY_SRC
                                                           | wgpu.BufferUsage.COPY_DST))
        enc = dev.create_command_encoder()
        for b, tmp in snap.values():
            enc.copy_buffer_to_buffer(b, 0, tmp, 0, b.size)
        dev.queue.submit([enc.finish()])
        for r in range(repeats):
            last = r == repeats - 1
            if last and self.timer is None:  # no timestamps: time each pass on the CPU clock
                empty = min(self._wall_ms(None) for _ in range(3))  # submit + fence alone
                for key, _, n, fn in passes:
                    ms = float(np.median([self._wall_ms(fn) for _ in range(3)]))
                    self.costs.calibrated[key] = max(ms - empty, 0.001 * n)
                continue
            timed = last and self.timer.begin()
            enc = dev.create_command_encoder()
            for key, label, n, fn in passes:
                w = self.timer.writes((None, PassStats(label, key=key, dispatches=n))) if timed else None
                fn(enc, {"timestamp_writes": w} if w else None)
            if timed:
                self.timer.end(enc)
            dev.queue.submit([enc.finish()])
            if timed:
                self.timer.submitted()
            self._wait_idle()
        enc = dev.create_command_encoder()
        for b, tmp in snap.values():
            enc.copy_buffer_to_buffer(tmp, 0, b, 0, b.size)
        dev.queue.submit([enc.finish()])
        self.flush()

    def _wall_ms(self, fn) -> float:
        self._wait_idle()
        t0 = time.perf_counter()
        enc = self.device.create_command_encoder()
        if fn is not None:
            fn(enc, None)
        self.device.queue.submit([enc.finish()])
        self._wait_idle()
        return (time.perf_counter() - t0) * 1e3

    def _all_passes(self, training: bool = True):
        s, out = self.session, []
        for i, feed in enumerate(self.before):
            out.append((("before", i), f"input {i}", feed.dispatches, feed.record))
        for p in filter(None, (self.infer, self.train_program if training else None)):
            for i, a, b in self.chunks[p]:
                out.append(((p, i), f"{p}[{a}:{b}]", b - a,
                            lambda e, kw, p=p, a=a, b=b: s.record(e, p, a, b, kw)))
        for i, o in enumerate(self.after):
            out.append((("after", i), f"output {i}", o.dispatches, o.record))
        return out

    # ------------------------------------------------------------- frames
    def _begin(self) -> FrameStats:
        if self._frame is None:
            self.frame += 1
            now = time.perf_counter()
            self._poll()
            prev = self.stats[-1].t if self.stats else None
            self._frame = FrameStats(self.frame, now, None if prev is None else (now - prev) * 1e3,
                                     bool(self.timer and self.timer.begin()))
        return self._frame

    def _pass(self, encoder, frame, label, key, dispatches, fn, kind="ml"):
        est = self.costs.estimate(key, dispatches) if key is not None else None
        p = PassStats(label, kind, key, dispatches, est)
        frame.passes.append(p)
        w = self.timer.writes((frame, p)) if frame.timed else None
        frame.pending += w is not None
        if fn is not None:
            fn(encoder, {"timestamp_writes": w} if w else None)
        return w

    def timed(self, label: str = "render") -> dict:
        """Keyword arguments for one of the host's passes, to measure it as render time:
        `encoder.begin_render_pass(..., **sched.timed("scene"))`."""
        w = self._pass(None, self._begin(), label, None, 0, None, kind="render")
        return {"timestamp_writes": w} if w else {}

    def record(self, encoder) -> dict:
        """Record this frame's ML work into `encoder`; returns the frame's statistics (filled in later)."""
        f = self._begin()
        if f.recorded:
            raise RuntimeError("record() twice in one frame: call submit() (or submitted()) after each frame")
        f.recorded = True
        s, spent = self.session, 0.0
        for i, feed in enumerate(self.before):
            self._pass(encoder, f, f"input {i}", ("before", i), feed.dispatches, feed.record)
            spent += self.costs.estimate(("before", i), feed.dispatches)
        if self.infer is not None:
            for i, a, b in self.chunks[self.infer]:
                self._pass(encoder, f, f"{self.infer}[{a}:{b}]", (self.infer, i), b - a,
                           lambda e, kw, a=a, b=b: s.record(e, self.infer, a, b, kw))
                spent += self.costs.estimate((self.infer, i), b - a)
            for rb in self._readbacks.get(self.infer, ()):
                rb.record(encoder)
        for i, out in enumerate(self.after):
            self._pass(encoder, f, f"output {i}", ("after", i), out.dispatches, out.record)
            spent += self.costs.estimate(("after", i), out.dispatches)
        f.chunks = len(f.passes) - sum(p.kind == "render" for p in f.passes)
        if self.training:
            if spent >= self.budget_ms:
                self.starved += 1
                if self.starved == 1:
                    log.warning("inference alone (%.2f ms estimated) fills the ML budget of %.2f ms: "
                                "training waits for a frame with room (raise budget_ms)", spent, self.budget_ms)
            spent = self._record_training(encoder, f, spent)
        f.ml_est_ms, f.steps_done = spent, self.steps_done
        return f

    def _record_training(self, encoder, f, spent):
        chunks, prog = self.chunks[self.train_program], self.train_program
        if not self._set_up():
            return spent
        while f.train_chunks < self.max_train_chunks:
            if self._step is None and not self._start_step():
                break
            st = self._step
            i, a, b = chunks[st.next]
            key = (prog, i)
            est = self.costs.estimate(key, b - a)
            known = self.costs.measured(key) or self.timer is None
            first = f.train_chunks == 0
            if not ((known and spent + est <= self.budget_ms) or (first and spent < self.budget_ms)):
                break
            if st.next == 0 and self._prepare is not None:
                self._prepare(encoder)
            self._step_buffers.record_chunk(encoder, st, i, lambda e: self._pass(
                e, f, f"{prog}[{a}:{b}] step {st.index}", key, b - a,
                lambda e2, kw: self.session.record(e2, prog, a, b, kw)))
            spent += est
            f.train_chunks += 1
            f.chunks += 1
            st.next += 1
            if st.next == len(chunks):
                self._step_buffers.held[st.slot].free_after = self.frame
                self._step = None
                self.steps_done += 1
                for rb in self._readbacks.get(prog, ()):
                    rb.record(encoder)
            if not known:
                break  # a chunk never measured runs alone: its cost is a guess
        return spent

    def _start_step(self) -> bool:
        if self._step_limit is not None and self.steps_started >= self._step_limit:
            self.training = False
            return False
        slot = self._step_buffers.free_slot(self.frame)
        if slot is None:
            return False
        uploaded = self._batches is not None
        if uploaded:
            batch = next(self._batches, None)
            if batch is None:
                self.training = False
                return False
            self._step_buffers.upload(slot, batch)
        self._step_buffers.held[slot].free_after = float("inf")
        self._step = Step(slot, self.steps_started, self.frame, uploaded)
        self.steps_started += 1
        return True

    def finish(self, encoder) -> None:
        """Last thing recorded into the frame's encoder: resolves the timestamp queries."""
        f = self._begin()
        if self.timer is not None and f.timed:
            self.timer.end(encoder)

    def submitted(self) -> None:
        """Call right after submitting the frame's encoder (submit() does both)."""
        f, self._frame = self._frame, None
        if f is None:
            raise RuntimeError("submitted() without a frame")
        if self.timer is not None:
            self.timer.submitted()
        for rbs in self._readbacks.values():
            for rb in rbs:
                rb.submitted()
        f.t_submit = now = time.perf_counter()
        f.cpu_ms = (now - f.t) * 1e3
        if self.trace is not None:
            self.trace.cpu(f"frame {f.frame}", f.t, now - f.t,
                           {"chunks": f.chunks, "train_chunks": f.train_chunks, "ml_est_ms": f.ml_est_ms})
        if f.pending == 0:
            self._complete(f)
        self.stats.append(f)

    def submit(self, encoder) -> None:
        """finish(encoder), submit it to the queue, submitted(). Never waits for the GPU."""
        self.finish(encoder)
        self.device.queue.submit([encoder.finish()])
        self.submitted()

    # ------------------------------------------------------------- measurements
    def _poll(self) -> None:
        if self.timer is None:
            return
        for (frame, p), begin_ns, ms in self.timer.poll():
            p.ms = ms
            if p.key is not None:
                self.costs.add(p.key, ms, p.dispatches)
            if frame is None:
                continue
            if self.trace is not None:
                self.trace.gpu(p.label, begin_ns, ms, frame.t_submit if frame.t_submit is not None else frame.t,
                               {"frame": frame.frame})
            frame.pending -= 1
            if frame.pending == 0:
                self._complete(frame)

    def _complete(self, f) -> None:
        if not all(p.ms is not None for p in f.passes):
            return  # an untimed frame: estimates only
        ml = [p.ms for p in f.passes if p.kind == "ml"]
        f.ml_ms, f.max_chunk_ms = sum(ml), max(ml, default=0.0)
        f.render_ms = sum(p.ms for p in f.passes if p.kind == "render")
        if self.trace is not None:
            self.trace.counter("ms per frame", f.t, {"ml": f.ml_ms, "render": f.render_ms, "budget": self.budget_ms})

    def poll(self) -> None:
        """Take in timings that arrived (record() does this each frame); never waits."""
        self._poll()

    def _wait_idle(self) -> None:
        enc = self.device.create_command_encoder()
        enc.clear_buffer(self._fence, 0, 8)
        self.device.queue.submit([enc.finish()])
        self._fence.map_sync(self._wgpu.MapMode.READ)
        self._fence.unmap()

    def flush(self, timeout: float = 10.0) -> None:
        """Blocking: wait for the GPU and for every pending timing. Not for use inside a frame."""
        if self._frame is not None:
            raise RuntimeError("flush() inside a frame: submit the frame first")
        self._wait_idle()
        end = time.perf_counter() + timeout
        while self.timer is not None and self.timer.pending and time.perf_counter() < end:
            self._poll()
            time.sleep(0.001)
        self._poll()

    def close(self) -> None:
        """Wait for the last timings and write the trace file (when one was asked for)."""
        self.flush()
        if self.trace is not None:
            self.trace.write(self.trace_path)

    def report(self) -> str:
        """summary() as a short table for people: one measure per line."""
        s = summary_rows(self.summary())
        width = max(len(k) for k, _ in s)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in s)

    def summary(self) -> dict:
        """Medians over the last `history` frames: ML, estimated and render GPU ms, CPU ms per
        frame, chunks per frame, training steps done and frames starved of training time."""
        frames = list(self.stats)
        ml = [f.ml_ms for f in frames if f.ml_ms is not None]
        est = [f.ml_est_ms for f in frames]

        def pct(v, q):
            return round(float(np.percentile(v, q)), 3) if v else None

        return {"frames": len(frames), "budget_ms": self.budget_ms, "timestamps": self.timestamps,
                "ml_ms_p50": pct(ml, 50), "ml_ms_max": round(float(max(ml)), 3) if ml else None,
                "ml_est_ms_p50": pct(est, 50),
                "render_ms_p50": pct([f.render_ms for f in frames if f.render_ms is not None], 50),
                "cpu_ms_p50": pct([f.cpu_ms for f in frames], 50),
                "chunks_per_frame": round(float(np.mean([f.chunks for f in frames])), 2) if frames else 0,
                "train_steps": self.steps_done, "starved_frames": self.starved}


def _ms(v) -> str:
    return "n/a" if v is None else f"{v:.2f} ms"


def summary_rows(s: dict) -> list:
    """(label, value) rows of a FrameScheduler.summary()."""
    return [("frames", f"{s['frames']} (ML budget {s['budget_ms']:g} ms per frame)"),
            ("ML GPU time p50 / max", f"{_ms(s['ml_ms_p50'])} / {_ms(s['ml_ms_max'])}"
             + ("" if s["timestamps"] else " (no timestamp queries: estimates only)")),
            ("ML estimate p50", _ms(s["ml_est_ms_p50"])),
            ("render GPU time p50", _ms(s["render_ms_p50"])),
            ("CPU time per frame p50", _ms(s["cpu_ms_p50"])),
            ("chunks per frame", f"{s['chunks_per_frame']:g}"),
            ("training steps", f"{s['train_steps']} ({s['starved_frames']} frames without training time)")]

"""Measuring GPU work without waiting for it, and remembering what things cost.

GpuTimer: timestamp queries around passes (timestampWrites), resolved into a ring of
mappable buffers read back with the non-blocking pattern of runtime/readback.py:
results arrive frames later, a frame never waits; with every slot in flight a frame
simply goes untimed.
Costs: per chunk, the recent measured GPU times; an estimate where none exists yet
(dispatches x a per-dispatch cost learned from measurements, or calibrated on the CPU
clock where the device has no timestamp queries).
Trace: Chrome trace-event JSON (Perfetto, chrome://tracing).
"""
from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from meganeura.runtime.readback import settled

FREE, COPIED, MAPPING = "free", "copied", "mapping"


@dataclass
class PassStats:
    """One pass of a frame: its label, "ml" or "render", its chunk's key for Costs (None for the
    host's own passes), dispatches, the estimate it was recorded with and its GPU time once measured."""

    label: str
    kind: str = "ml"
    key: tuple | None = None
    dispatches: int = 0
    est: float | None = None
    ms: float | None = None


@dataclass
class FrameStats:
    """One frame of a FrameScheduler: what it recorded, and its GPU times once they arrive (None
    until then, or for good in an untimed frame)."""

    frame: int
    t: float  # when it began (time.perf_counter)
    interval_ms: float | None  # since the previous frame began
    timed: bool  # whether its passes carry timestamp queries
    passes: list = field(default_factory=list)  # PassStats
    pending: int = 0  # timed passes whose times have not arrived
    ml_est_ms: float = 0.0
    ml_ms: float | None = None
    render_ms: float | None = None
    max_chunk_ms: float | None = None
    chunks: int = 0
    train_chunks: int = 0
    steps_done: int = 0
    recorded: bool = False
    t_submit: float | None = None
    cpu_ms: float | None = None


@dataclass
class _Slot:
    """A query set, its resolve buffer and a mappable copy; the labels of the passes it times."""

    query_set: object
    resolve: object
    read: object
    state: str = FREE
    labels: list = field(default_factory=list)
    promise: object = None


class GpuTimer:
    """Timestamp queries for the passes of one frame at a time, read back frames later."""

    def __init__(self, device, capacity: int = 256, depth: int = 4, period_ns: float = 1.0):
        import wgpu

        self.device, self.capacity, self.period_ns = device, capacity, period_ns
        self._wgpu = wgpu
        u = wgpu.BufferUsage
        self.slots = [_Slot(device.create_query_set(type="timestamp", count=capacity),
                            device.create_buffer(size=capacity * 8, usage=u.QUERY_RESOLVE | u.COPY_SRC),
                            device.create_buffer(size=capacity * 8, usage=u.MAP_READ | u.COPY_DST))
                      for _ in range(depth)]
        self.current = None
        self.untimed_frames = 0

    @property
    def pending(self) -> int:
        return sum(s.state != FREE for s in self.slots)

    def begin(self) -> bool:
        """Start timing a frame; False when every slot is still in flight (the frame goes untimed)."""
        self.current = next((s for s in self.slots if s.state == FREE), None)
        if self.current is None:
            self.untimed_frames += 1
            return False
        self.current.labels = []
        return True

    def writes(self, label):
        """timestamp_writes for one pass (label comes back from poll), or None."""
        s = self.current
        if s is None or 2 * len(s.labels) + 2 > self.capacity:
            return None
        i = 2 * len(s.labels)
        s.labels.append(label)
        return {"query_set": s.query_set, "beginning_of_pass_write_index": i, "end_of_pass_write_index": i + 1}

    def end(self, encoder) -> None:
        """Resolve this frame's queries into its slot (recorded last in the frame's encoder)."""
        s, self.current = self.current, None
        if s is not None and s.labels:
            n = 2 * len(s.labels)
            encoder.resolve_query_set(s.query_set, 0, n, s.resolve, 0)
            encoder.copy_buffer_to_buffer(s.resolve, 0, s.read, 0, n * 8)
            s.state = COPIED

    def submitted(self) -> None:
        for s in self.slots:
            if s.state == COPIED:
                s.promise = s.read.map_async(self._wgpu.MapMode.READ)
                s.state = MAPPING

    def poll(self) -> list:
        """[(label, begin_ns, duration_ms)] of every frame whose timestamps have arrived; never waits."""
        out = []
        for s in self.slots:
            if s.state == MAPPING and settled(s.promise):
                s.promise.sync_wait()  # settled: returns at once
                n = 2 * len(s.labels)
                ticks = np.frombuffer(s.read.read_mapped(0, n * 8, copy=True), np.uint64).astype(np.int64)
                s.read.unmap()
                s.state, s.promise = FREE, None
                for k, label in enumerate(s.labels):
                    begin, end = ticks[2 * k], ticks[2 * k + 1]
                    out.append((label, float(begin) * self.period_ns, max(0.0, (end - begin) * self.period_ns / 1e6)))
        return out


class Costs:
    """What each chunk costs on the GPU, in ms: the worst of its last `window` measurements."""

    def __init__(self, dispatch_ms: float = 0.05, window: int = 4):
        self.default_dispatch_ms, self.window = dispatch_ms, window
        self.history = {}
        self._per_dispatch = deque(maxlen=64)
        self.calibrated = {}  # key -> ms, from a CPU-clock calibration (devices without timestamps)

    def add(self, key, ms: float, dispatches: int) -> None:
        self.history.setdefault(key, deque(maxlen=self.window)).append(ms)
        if dispatches:
            self._per_dispatch.append(ms / dispatches)

    def measured(self, key) -> bool:
        return key in self.history or key in self.calibrated

    @property
    def dispatch_ms(self) -> float:
        return float(np.median(self._per_dispatch)) if self._per_dispatch else self.default_dispatch_ms

    def estimate(self, key, dispatches: int) -> float:
        if key in self.history:
            return max(self.history[key])
        if key in self.calibrated:
            return self.calibrated[key]
        return dispatches * self.dispatch_ms


class Trace:
    """Chrome trace events: CPU frame spans, GPU pass spans, counters."""

    CPU, GPU = 1, 2

    def __init__(self):
        self.t0 = time.perf_counter()
        self.events = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "meganeura frame loop"}},
                       {"name": "thread_name", "ph": "M", "pid": 1, "tid": self.CPU, "args": {"name": "CPU"}},
                       {"name": "thread_name", "ph": "M", "pid": 1, "tid": self.GPU, "args": {"name": "GPU queue"}}]
        self._gpu_offset_us = None

    def us(self, t: float) -> float:
        return (t - self.t0) * 1e6

    def cpu(self, name, start: float, dur_s: float, args=None) -> None:
        self.events.append({"name": name, "ph": "X", "pid": 1, "tid": self.CPU, "ts": round(self.us(start), 3),
                            "dur": round(dur_s * 1e6, 3), **({"args": args} if args else {})})

    def gpu(self, name, begin_ns: float, dur_ms: float, submitted: float, args=None) -> None:
        """A GPU span; GPU clock -> trace clock by an offset anchored at a submit time."""
        begin_us = begin_ns / 1e3
        if self._gpu_offset_us is None or begin_us + self._gpu_offset_us < self.us(submitted):
            self._gpu_offset_us = self.us(submitted) - begin_us
        self.events.append({"name": name, "ph": "X", "pid": 1, "tid": self.GPU,
                            "ts": round(begin_us + self._gpu_offset_us, 3), "dur": round(dur_ms * 1e3, 3),
                            **({"args": args} if args else {})})

    def counter(self, name, t: float, values: dict) -> None:
        self.events.append({"name": name, "ph": "C", "pid": 1, "ts": round(self.us(t), 3), "args": values})

    def write(self, path) -> None:
        with open(path, "w") as f:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ms"}, f)

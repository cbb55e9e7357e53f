"""GPU and CPU timing for meganeura programs: timestamp queries around one compute pass,
host time to encode, and wall-clock latency, all on the session's own device."""
from __future__ import annotations

import time

import numpy as np


class GpuTimer:
    """Times one compute pass with timestamp queries (1 tick = the queue's period)."""

    def __init__(self, device):
        import wgpu

        self.device = device
        self.ok = "timestamp-query" in device.features
        if not self.ok:
            return
        self.qs = device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
        self.resolve = device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self.read = device.create_buffer(size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def pass_kwargs(self):
        return {"timestamp_writes": {"query_set": self.qs, "beginning_of_pass_write_index": 0,
                                     "end_of_pass_write_index": 1}} if self.ok else {}

    def finish(self, encoder):
        if self.ok:
            encoder.resolve_query_set(self.qs, 0, 2, self.resolve, 0)
            encoder.copy_buffer_to_buffer(self.resolve, 0, self.read, 0, 16)

    def seconds(self) -> float | None:
        import wgpu

        if not self.ok:
            return None
        self.read.map_sync(wgpu.MapMode.READ)
        t0, t1 = np.frombuffer(self.read.read_mapped(0, 16), np.uint64)
        self.read.unmap()
        return float(t1 - t0) * 1e-9  # NVIDIA and lavapipe report 1 ns ticks (DESIGN.md)


def _loop(run_once, iters: int, warmup: int, budget_s: float | None) -> list:
    """`warmup` untimed runs (fewer once they took a quarter of `budget_s`; at least one),
    then up to `iters` timed ones, stopping once they took `budget_s` (at least 3 runs)."""
    t0 = time.perf_counter()
    for _ in range(max(warmup, 1)):
        run_once()
        if budget_s and time.perf_counter() - t0 > budget_s / 4:
            break
    samples = []
    t0 = time.perf_counter()
    while len(samples) < iters:
        samples.append(run_once())
        if budget_s and len(samples) >= 3 and time.perf_counter() - t0 > budget_s:
            break
    return samples


def time_program(session, program: str, inputs: dict, iters: int = 50, warmup: int = 5,
                 budget_s: float | None = None) -> dict:
    """Median GPU time of the whole program in one pass, median wall latency of a run
    (encode, submit, wait; the inputs are uploaded once, before), and host encode time per
    dispatch. `budget_s` bounds the timed loop's seconds (big models run fewer iterations)."""
    dev = session.device
    timer = GpuTimer(dev)
    session.write_inputs(program, inputs)

    def once():
        t0 = time.perf_counter()
        enc = dev.create_command_encoder()
        t1 = time.perf_counter()
        session.record(enc, program, pass_kwargs=timer.pass_kwargs())
        t2 = time.perf_counter()
        timer.finish(enc)
        dev.queue.submit([enc.finish()])
        g = timer.seconds()  # map_sync: waits for this submission
        return g, time.perf_counter() - t0, t2 - t1

    samples = _loop(once, iters, warmup, budget_s)
    gpu, wall, encode = zip(*samples)
    n = session.dispatch_count(program)
    return {"gpu_ms": float(np.median(gpu)) * 1e3 if gpu[0] is not None else None,
            "wall_ms": float(np.median(wall)) * 1e3, "dispatches": n, "iters": len(samples),
            "encode_us_per_dispatch": float(np.median(encode)) * 1e6 / max(n, 1)}


def time_run(session, program: str, inputs: dict, iters: int = 50, warmup: int = 2,
             budget_s: float | None = None) -> dict:
    """Median wall latency of one synchronous call through the public API,
    `Session.run(program, inputs)`: the inputs checked and uploaded, the program recorded
    and submitted, the wait, the outputs read back (a training step's loss)."""

    def once():
        t0 = time.perf_counter()
        session.run(program, inputs)
        return time.perf_counter() - t0

    samples = _loop(once, iters, warmup, budget_s)
    return {"wall_ms": float(np.median(samples)) * 1e3, "iters": len(samples)}


def time_torch(fn, iters: int = 50, warmup: int = 5, budget_s: float | None = None, device: str = "cuda") -> dict:
    """Median CUDA-event time and wall latency of fn() on the current CUDA device. On the
    CPU (`device="cpu"`, smoke runs) both are the wall time."""
    import torch

    cuda = device != "cpu"

    def once():
        if not cuda:
            t0 = time.perf_counter()
            fn()
            w = time.perf_counter() - t0
            return w, w
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        w = time.perf_counter() - t0
        return s.elapsed_time(e) * 1e-3, w

    if cuda:
        torch.cuda.synchronize()
    samples = _loop(once, iters, warmup, budget_s)
    gpu, wall = zip(*samples)
    return {"gpu_ms": float(np.median(gpu)) * 1e3, "wall_ms": float(np.median(wall)) * 1e3, "iters": len(samples)}

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


def time_program(session, program: str, inputs: dict, iters: int = 50, warmup: int = 5) -> dict:
    """Median GPU time of the whole program in one pass, median wall latency of a run
    (upload, encode, submit, wait), and host encode time per dispatch."""
    dev = session.device
    timer = GpuTimer(dev)
    session.write_inputs(program, inputs)
    gpu, wall, encode = [], [], []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        enc = dev.create_command_encoder()
        t1 = time.perf_counter()
        session.record(enc, program, pass_kwargs=timer.pass_kwargs())
        t2 = time.perf_counter()
        timer.finish(enc)
        dev.queue.submit([enc.finish()])
        g = timer.seconds()  # map_sync: waits for this submission
        t3 = time.perf_counter()
        if i >= warmup:
            gpu.append(g)
            wall.append(t3 - t0)
            encode.append(t2 - t1)
    n = session.dispatch_count(program)
    return {"gpu_ms": float(np.median(gpu)) * 1e3 if gpu[0] is not None else None,
            "wall_ms": float(np.median(wall)) * 1e3, "dispatches": n,
            "encode_us_per_dispatch": float(np.median(encode)) * 1e6 / max(n, 1)}


def time_torch(fn, iters: int = 50, warmup: int = 5) -> dict:
    """Median CUDA-event time and wall latency of fn() on the current CUDA device."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    gpu, wall = [], []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        wall.append(time.perf_counter() - t0)
        gpu.append(s.elapsed_time(e) * 1e-3)
    return {"gpu_ms": float(np.median(gpu)) * 1e3, "wall_ms": float(np.median(wall)) * 1e3}

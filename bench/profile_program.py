"""GPU time per dispatch of a program (one compute pass per dispatch, timestamp queries),
grouped by kernel label: where a program's time goes.

    python bench/profile_program.py dinovision --size 224 --eyes 1 [--program infer]
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def profile(session, program: str, repeats: int = 5, chunk: int = 2000) -> list:
    """(median ms, kernel label, workgroups) per dispatch; chunks of `chunk` dispatches per
    submit, since a query set holds at most 4096 timestamps."""
    n = len(session.programs[program])
    med = np.zeros(n)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        med[lo:hi] = _profile_range(session, program, lo, hi, repeats)
    from meganeura.runtime.package import as_variant

    pkg = session.package
    rows = []
    for i, d in enumerate(pkg.programs[program]["dispatches"]):
        d = as_variant(d, session.device_class)
        rows.append((float(med[i]), pkg.manifest["kernels"][d["kernel"]]["label"], d["workgroups"]))
    return rows


def _profile_range(session, program, lo, hi, repeats):
    import wgpu

    dev = session.device
    n = hi - lo
    qs = dev.create_query_set(type="timestamp", count=2 * n)
    resolve = dev.create_buffer(size=16 * n, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    read = dev.create_buffer(size=16 * n, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
    times = np.zeros((repeats, n))
    for r in range(repeats + 1):
        enc = dev.create_command_encoder()
        for i in range(n):
            session.record(enc, program, lo + i, lo + i + 1, pass_kwargs={"timestamp_writes": {
                "query_set": qs, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1}})
        enc.resolve_query_set(qs, 0, 2 * n, resolve, 0)
        enc.copy_buffer_to_buffer(resolve, 0, read, 0, 16 * n)
        dev.queue.submit([enc.finish()])
        read.map_sync(wgpu.MapMode.READ)
        ticks = np.frombuffer(read.read_mapped(0, 16 * n), np.uint64).astype(np.int64).reshape(n, 2)
        read.unmap()
        if r:
            times[r - 1] = (ticks[:, 1] - ticks[:, 0]) * 1e-6
    return np.median(times, axis=0)


def summarize(rows, top_labels: int = 12, top_dispatches: int = 8) -> dict:
    """Where the time goes: total, per kernel label (sum, count), and the slowest dispatches."""
    tot = collections.defaultdict(lambda: [0.0, 0])
    for ms, label, _ in rows:
        tot[label][0] += ms
        tot[label][1] += 1
    labels = sorted(tot.items(), key=lambda kv: -kv[1][0])[:top_labels]
    return {"total_ms": sum(r[0] for r in rows), "dispatches": len(rows),
            "labels": [{"label": k, "ms": v[0], "count": v[1]} for k, v in labels],
            "slowest": [{"label": lab, "ms": ms, "workgroups": list(wg)}
                        for ms, lab, wg in sorted(rows, key=lambda r: -r[0])[:top_dispatches]]}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["dinovision"])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--eyes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--program", default="infer")
    ap.add_argument("--f32-backbone", action="store_true", help="f32 backbone weights (the demo stores them f16)")
    args = ap.parse_args(argv)
    from meganeura.demos.dinovision.app import load_backbone
    from meganeura.demos.dinovision.model import DemoConfig, compile_demo
    from meganeura.runtime import Package, Session

    w = load_backbone()
    for eyes in args.eyes:
        s = Session(None, Package.from_bytes(compile_demo(DemoConfig(height=args.size, width=args.size, eyes=eyes), w,
                                                               half_backbone=not args.f32_backbone)))
        x = np.zeros((eyes, 3, args.size, args.size), np.float32)
        s.run("infer", {"pixel_values": x})
        for prog in [args.program, "train_decoder"]:
            rows = profile(s, prog)
            tot = collections.defaultdict(float)
            for ms, label, _ in rows:
                tot[label] += ms
            print(f"eyes {eyes} {prog}: {sum(tot.values()):.3f} ms in {len(rows)} dispatches")
            for label, ms in sorted(tot.items(), key=lambda kv: -kv[1])[:8]:
                print(f"   {ms:7.3f} ms  {label}")
            for ms, label, wg in sorted(rows, key=lambda r: -r[0])[:5]:
                print(f"      {ms:7.3f} ms  {label} {wg}")


if __name__ == "__main__":
    main()

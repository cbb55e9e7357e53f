"""Where a synchronous call's wall time goes: DINOv2 ViT-S/14 (224, batch 1) inference,
one call that uploads the input, runs the program and reads the output back, against the
program's GPU time (timestamp queries), with PyTorch's synchronous calls beside it.

    python bench/sync_call.py [--smoke] [--json OUT]

Rows (medians, ms): the public API (`Session.run`), then the same call by hand with each
step timed: upload, record (encoder and pass), copy + finish, submit, wait, read; then the
host's own encoder (`Session.record` into it, one submit, a map of the output).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
ITERS = 200


def _median_ms(samples):
    return float(np.median(samples)) * 1e3


def _steps(session, x, name, out, wait="event"):
    """One call by hand: seconds for upload, record, copy+finish, submit, wait, read.
    wait: "event" (map_sync: wgpu-py's poll thread resolves the map, the caller waits on an
    event) or "poll" (the caller polls the device, blocking, then maps)."""
    import wgpu

    dev = session.device
    t0 = time.perf_counter()
    session.write_inputs("infer", {name: x})
    t1 = time.perf_counter()
    enc = dev.create_command_encoder()
    session.record(enc, "infer")
    t2 = time.perf_counter()
    buf, offset, size, stage = out
    enc.copy_buffer_to_buffer(buf, offset, stage, 0, size)
    cb = enc.finish()
    t3 = time.perf_counter()
    dev.queue.submit([cb])
    t4 = time.perf_counter()
    if wait == "poll":
        dev._poll_wait()  # (private to wgpu-py: measured here only)
    stage.map_sync(wgpu.MapMode.READ)
    t5 = time.perf_counter()
    np.frombuffer(stage.read_mapped(0, size), np.float32).copy()
    stage.unmap()
    t6 = time.perf_counter()
    return np.diff([t0, t1, t2, t3, t4, t5, t6])


def measure(smoke: bool) -> dict:
    import wgpu

    from meganeura.compiler import compile_model
    from meganeura.runtime import Package, Session
    from models import dinov2_vits14
    from timing import time_program, time_torch

    case = dinov2_vits14(smoke=smoke)
    session = Session(None, Package.from_bytes(compile_model(case.model)))
    x = case.inputs["pixel_values"]
    gpu = time_program(session, "infer", {"pixel_values": x}, iters=ITERS)
    runs = []
    for _ in range(ITERS + 10):
        t = time.perf_counter()
        session.run("infer", {"pixel_values": x})
        runs.append(time.perf_counter() - t)
    t = session.package.parsed.programs["infer"].outputs
    (oname, ot), = list(t.items())[:1]
    size = ot.count * 4
    stage = session.device.create_buffer(size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
    out = (session.buffers[ot.buffer], ot.offset, size, stage)
    res = {"gpu_ms": gpu["gpu_ms"], "dispatches": gpu["dispatches"], "run_wall_ms": _median_ms(runs[10:]),
           "encode_us_per_dispatch": gpu["encode_us_per_dispatch"]}
    for wait in ("event", "poll"):
        steps = np.array([_steps(session, x, "pixel_values", out, wait) for _ in range(ITERS + 10)][10:])
        res[f"by_hand_{wait}"] = {"wall_ms": _median_ms(steps.sum(1)), **{
            k: _median_ms(steps[:, i]) for i, k in enumerate(["upload", "record", "copy_finish", "submit", "wait",
                                                               "read"])}}
    res["run_minus_gpu_ms"] = res["run_wall_ms"] - res["gpu_ms"]
    res["torch"] = _torch_calls(case, time_torch) if not smoke else {}
    return res


def _torch_calls(case, time_torch):
    """Wall time of one synchronous call (input upload, run, output to the host) in PyTorch."""
    import torch

    out = {}
    for name, (fn, _) in case.torch_variants("cuda").items():
        x = torch.tensor(case.inputs["pixel_values"])

        def call():
            y = fn()
            return (y if y is not None else torch.zeros(1, device="cuda")).cpu()
        r = time_torch(lambda: (x.to("cuda", non_blocking=False), call()), iters=ITERS)
        out[name] = {"gpu_ms": r["gpu_ms"], "wall_ms": r["wall_ms"]}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    import wgpu

    res = measure(args.smoke)
    a = wgpu.gpu.request_adapter_sync(power_preference="high-performance").info
    res["env"] = {"date": time.strftime("%Y-%m-%d"), "gpu": a["device"], "driver": a.get("description", ""),
                  "wgpu": wgpu.__version__, "python": platform.python_version()}
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

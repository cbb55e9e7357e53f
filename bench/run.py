"""Side-by-side benchmark: meganeura (wgpu, Vulkan) and PyTorch (CUDA eager, fp32, TF32 off)
on the same GPU in one process. Prints ratio tables and writes JSON.

    python bench/run.py [--out DIR] [--only NAME ...] [--iters N]

Ratios are meganeura / PyTorch: below 1 means meganeura is faster.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).parent))
from timing import time_program, time_torch  # noqa: E402
from workloads import WORKLOADS  # noqa: E402


def run_one(name, spec, iters, device):
    import torch

    from meganeura.compiler import compile_model
    from meganeura.runtime import Package, Session

    row = {"workload": name}
    model, train, inputs, torch_setup = spec()
    t = time.perf_counter()
    data = compile_model(model, train)
    row["compile_s"] = time.perf_counter() - t
    t = time.perf_counter()
    session = Session(device, Package.from_bytes(data))
    row["load_s"] = time.perf_counter() - t
    row["gpu_bytes"] = Package.from_bytes(data).manifest["memory"]["buffer_bytes"]
    torch.cuda.reset_peak_memory_stats()
    tfwd, ttrain = torch_setup()
    for prog, tfn in (("infer", tfwd), ("train_step", ttrain)):
        if prog not in session.programs or tfn is None:
            continue
        feed = {k: v for k, v in inputs.items() if prog == "train_step" or k != "labels"}
        ours = time_program(session, prog, feed, iters=iters)
        theirs = time_torch(tfn, iters=iters)
        row[prog] = {"meganeura": ours, "torch": theirs,
                     "gpu_ratio": ours["gpu_ms"] / theirs["gpu_ms"] if ours["gpu_ms"] else None,
                     "wall_ratio": ours["wall_ms"] / theirs["wall_ms"]}
    row["torch_peak_bytes"] = int(torch.cuda.max_memory_allocated())
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args(argv)
    import torch
    import wgpu

    from meganeura.runtime.device import default_device

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = default_device()
    info = {"date": time.strftime("%Y-%m-%d"), "gpu": device.adapter.info["device"],
            "driver": device.adapter.info.get("description", ""), "backend": device.adapter.info["backend_type"],
            "wgpu": wgpu.__version__, "torch": torch.__version__, "cuda": torch.version.cuda,
            "torch_gpu": torch.cuda.get_device_name(0), "python": platform.python_version(),
            "features": sorted(device.features)}
    rows = []
    for name, spec in WORKLOADS.items():
        if args.only and name not in args.only:
            continue
        try:
            rows.append(run_one(name, spec, args.iters, device))
        except Exception as exc:  # one broken workload must not hide the others
            rows.append({"workload": name, "error": f"{type(exc).__name__}: {exc}"})
        print(_line(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    table = _table(info, rows)
    (out / "bench.md").write_text(table)
    print(table)


def _line(r):
    if "error" in r:
        return f"{r['workload']}: ERROR {r['error']}"
    parts = [r["workload"], f"compile {r['compile_s']:.3f}s"]
    for p in ("infer", "train_step"):
        if p in r:
            m, t = r[p]["meganeura"], r[p]["torch"]
            parts.append(f"{p}: gpu {m['gpu_ms']:.3f} vs {t['gpu_ms']:.3f} ms, wall {m['wall_ms']:.3f} vs "
                         f"{t['wall_ms']:.3f} ms ({m['dispatches']} dispatches)")
    return " | ".join(parts)


def _table(info, rows):
    lines = [f"# Benchmark {info['date']}: {info['gpu']} ({info['backend']}, {info['driver']}), "
             f"wgpu {info['wgpu']}, torch {info['torch']} CUDA {info['cuda']}, fp32 (TF32 off)", "",
             "| workload | program | meganeura GPU ms | torch GPU ms | GPU ratio | meganeura wall ms | torch wall ms "
             "| wall ratio | dispatches | encode us/dispatch |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workload']} | error: {r['error'][:80]} |")
            continue
        for p in ("infer", "train_step"):
            if p not in r:
                continue
            m, t = r[p]["meganeura"], r[p]["torch"]
            lines.append(f"| {r['workload']} | {p} | {m['gpu_ms']:.3f} | {t['gpu_ms']:.3f} | {r[p]['gpu_ratio']:.2f} | "
                         f"{m['wall_ms']:.3f} | {t['wall_ms']:.3f} | {r[p]['wall_ratio']:.2f} | {m['dispatches']} | "
                         f"{m['encode_us_per_dispatch']:.1f} |")
    lines += ["", "| workload | compile s | load s | meganeura buffers MB | torch peak MB |", "|---|---|---|---|---|"]
    for r in rows:
        if "error" not in r:
            lines.append(f"| {r['workload']} | {r['compile_s']:.3f} | {r['load_s']:.3f} | {r['gpu_bytes'] / 2**20:.1f} | "
                         f"{r['torch_peak_bytes'] / 2**20:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

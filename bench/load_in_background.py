"""A host's frames during a package's first launch: a 60 Hz loop whose frames each run a small
program and read it back, while Session.load_in_background makes a big package's Session on a
thread, against one frame making it with Session(...) (the frame the game would drop). Run
each mode in a process of its own on an empty driver shader cache (__GL_SHADER_DISK_CACHE_PATH
a fresh folder) for a first launch.

    python bench/load_in_background.py --only "ResNet-50 224 (b16" --mode background [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from load_profile import compiled_packages


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--mode", choices=("background", "blocking"), default="background")
    ap.add_argument("--hz", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=None,
                    help="compile threads: load_in_background's threads= (default: the cores less "
                         "loading.SPARE_CORES); with --mode blocking, session.LOAD_THREADS")
    ap.add_argument("--upload-threads", type=int, default=None, help="session.UPLOAD_THREADS (default: as set)")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval while loading (Python's default: 0.005 s)")
    ap.add_argument("--out", default="out/bench")
    args = ap.parse_args(argv)
    from meganeura.compiler import compile_model
    from meganeura.compiler.models import mlp
    from meganeura.runtime import Package, Session
    from meganeura.runtime import session as session_module
    from meganeura.runtime.device import default_device

    from meganeura.runtime.loading import default_threads

    if args.threads is not None and args.mode == "blocking":
        session_module.LOAD_THREADS = args.threads
    threads = session_module.LOAD_THREADS if args.mode == "blocking" else min(
        session_module.LOAD_THREADS, args.threads or default_threads())
    if args.upload_threads is not None:
        session_module.UPLOAD_THREADS = args.upload_threads
    if args.switch_interval is not None:
        import sys

        sys.setswitchinterval(args.switch_interval)

    dev = default_device()
    frame_session = Session(dev, Package.from_bytes(compile_model(mlp.mlp([64, 128, 10], batch=64))))
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    period = 1.0 / args.hz

    def frame():
        t = time.perf_counter()
        frame_session.run("infer", {"x": x})
        return time.perf_counter() - t

    rows = []
    for name, path in compiled_packages(args.only):
        before = [frame() for _ in range(30)]  # the frames' own cost, nothing loading
        works, progress, frames = [], [], []
        t0 = time.perf_counter()
        if args.mode == "blocking":
            t = time.perf_counter()
            session = Session(dev, path)
            frame()
            works.append(time.perf_counter() - t)
        else:
            pending = Session.load_in_background(dev, path, threads=threads)
            while not pending.done():
                start = time.perf_counter() - t0
                w = frame()
                works.append(w)
                progress.append(round(pending.progress, 3))
                frames.append((round(start * 1e3, 1), round(w * 1e3, 2), progress[-1]))
                time.sleep(max(0.0, period - w))
            session = pending.result()
        load_s = time.perf_counter() - t0
        ms = np.array(works) * 1e3
        row = {"workload": name, "mode": args.mode, "load_threads": threads,
               "upload_threads": session_module.UPLOAD_THREADS, "switch_interval": args.switch_interval, "load_s": load_s, "frames_during_load": len(works),
               "frame_ms_before_p50": float(np.median(before) * 1e3),
               "frame_ms_p50": float(np.median(ms)), "frame_ms_p99": float(np.percentile(ms, 99)),
               "frame_ms_max": float(ms.max()), "frames_over_period": int((ms > period * 1e3).sum()),
               "progress_samples": progress[:: max(1, len(progress) // 20)], "kernels": len(session.kernels),
               "frames": frames}  # (ms since the load began, the frame's ms, progress after it)
        print(json.dumps({k: v for k, v in row.items() if k != "frames"}), flush=True)
        rows.append(row)
        session.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = "-".join("".join(c for c in o if c.isalnum()) for o in (args.only or ["all"])) + time.strftime("-%H%M%S")
    (out / f"load_in_background_{slug}_{args.mode}_{threads}_{session_module.UPLOAD_THREADS}_{args.switch_interval}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

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

from load_profile import add_session_flags, apply_session_flags, compiled_packages


PHASES = ("write_buffer", "create_command_encoder", "submit", "map_sync")


def _time_frame_calls() -> dict:
    """Wrap wgpu's calls a frame makes so that, on the main thread, each adds its seconds to the
    returned dict (which frame() clears): where a slow frame waits. Only the outermost call
    counts (map_sync makes its own command encoder and submit: their time is map_sync's)."""
    import threading

    from wgpu.backends.wgpu_native import GPUBuffer, GPUDevice, GPUQueue

    spent, main, depth = {}, threading.main_thread(), [0]
    for cls, name in ((GPUQueue, "write_buffer"), (GPUDevice, "create_command_encoder"),
                      (GPUQueue, "submit"), (GPUBuffer, "map_sync")):
        def timed(*a, _f=getattr(cls, name), _name=name, **kw):
            if threading.current_thread() is not main or depth[0]:
                return _f(*a, **kw)
            depth[0] += 1
            t = time.perf_counter()
            try:
                return _f(*a, **kw)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - t
                depth[0] -= 1
        setattr(cls, name, timed)
    return spent


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--mode", choices=("background", "blocking"), default="background")
    ap.add_argument("--hz", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=None,
                    help="compile threads: load_in_background's threads= (default: the cores less "
                         "loading.SPARE_CORES); with --mode blocking, loader.LOAD_THREADS")
    add_session_flags(ap)
    ap.add_argument("--switch-interval", default=None,
                    help="load_in_background's switch_interval in seconds, or 'off' (None: Python's own, 5 ms); "
                         "default: the library's (loading.SWITCH_INTERVAL)")
    ap.add_argument("--phases", action="store_true",
                    help="each frame's time split into its wgpu calls (write_buffer, submit, map_sync, the rest)")
    ap.add_argument("--quick-start", action="store_true",
                    help="Session(quick_start=True); then frames go on until the tuned kernels run (tuned_s, "
                         "frame_ms_max_until_tuned; with or without it, frames_after until the training state "
                         "is made too, training_s)")
    ap.add_argument("--out", default="out/bench")
    args = ap.parse_args(argv)
    from meganeura.compiler import compile_model
    from meganeura.compiler.models import mlp
    from meganeura.runtime import Package, Session, loader
    from meganeura.runtime.device import default_device

    from meganeura.runtime.loading import SWITCH_INTERVAL, default_threads

    if args.threads is not None and args.mode == "blocking":
        loader.LOAD_THREADS = args.threads
    threads = loader.LOAD_THREADS if args.mode == "blocking" else min(
        loader.LOAD_THREADS, args.threads or default_threads())
    apply_session_flags(args)
    switch = SWITCH_INTERVAL if args.switch_interval is None else \
        None if args.switch_interval == "off" else float(args.switch_interval)

    dev = default_device()
    frame_session = Session(dev, Package.from_bytes(compile_model(mlp.mlp([64, 128, 10], batch=64))))
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    period = 1.0 / args.hz

    phases = _time_frame_calls() if args.phases else None

    def frame():
        t = time.perf_counter()
        if phases is not None:
            phases.clear()
        frame_session.run("infer", {"x": x})
        return time.perf_counter() - t

    rows = []
    for name, path in compiled_packages(args.only):
        before = [frame() for _ in range(30)]  # the frames' own cost, nothing loading
        works, progress, frames = [], [], []
        t0 = time.perf_counter()
        if args.mode == "blocking":
            t = time.perf_counter()
            session = Session(dev, path, quick_start=args.quick_start)
            frame()
            works.append(time.perf_counter() - t)
        else:
            pending = Session.load_in_background(dev, path, threads=threads, switch_interval=switch,
                                                 quick_start=args.quick_start)
            while not pending.done():
                start = time.perf_counter() - t0
                w = frame()
                works.append(w)
                progress.append(round(pending.progress, 3))
                frames.append((round(start * 1e3, 1), round(w * 1e3, 2), progress[-1])
                              + ((tuple(round(1e3 * phases.get(k, 0.0), 2) for k in PHASES),) if phases is not None else ()))
                time.sleep(max(0.0, period - w))
            session = pending.result()
        load_s = time.perf_counter() - t0
        tier, later, after = session.tier, [], []  # the frames while the tuned kernels compile behind the quick tier
        training_s = tuned_s = tuned_error = None

        def tuned():  # (the tuned tier in, or given up)
            nonlocal tuned_error
            try:
                session.wait_tuned(0)
            except TimeoutError:
                return False
            except Exception as exc:  # noqa: BLE001  (the row says so; the quick tier ran on)
                tuned_error = repr(exc)
            return True
        while time.perf_counter() - t0 < 60:
            if training_s is None and session.training_ready:
                training_s = time.perf_counter() - t0
            if tuned_s is None and tuned():
                tuned_s = time.perf_counter() - t0
            if training_s is not None and tuned_s is not None:
                break
            start = time.perf_counter() - t0
            w = frame()
            if tuned_s is None:
                later.append(w)
            after.append((round(start * 1e3, 1), round(w * 1e3, 2), training_s is not None)
                         + ((tuple(round(1e3 * phases.get(k, 0.0), 2) for k in PHASES),) if phases is not None else ()))
            time.sleep(max(0.0, period - w))
        ms = np.array(works) * 1e3
        row = {"workload": name, "mode": args.mode, "load_threads": threads,
               "upload_threads": session.upload_threads, "bind_group_threads": loader.BIND_GROUP_THREADS, "switch_interval": switch if args.mode == "background" else None, "load_s": load_s, "frames_during_load": len(works),
               "frame_ms_before_p50": float(np.median(before) * 1e3),
               "frame_ms_p50": float(np.median(ms)), "frame_ms_p99": float(np.percentile(ms, 99)),
               "frame_ms_max": float(ms.max()), "frames_over_period": int((ms > period * 1e3).sum()),
               "progress_samples": progress[:: max(1, len(progress) // 20)], "kernels": len(session.kernels),
               "tier_at_load": tier, "tuned_s": tuned_s, "tuned_error": tuned_error, "training_s": training_s,
               "frames_until_tuned": len(later),
               "frame_ms_max_until_tuned": float(max(later, default=0.0) * 1e3),
               "frame_ms_p50_until_tuned": float(np.median(later) * 1e3) if later else None,
               "frames": frames,  # (ms since the load began, the frame's ms, progress after it[, ms per PHASES])
               # after the load, until the training state is made (or given up) and the tuned tier in:
               # (ms since the load began, the frame's ms, training state made before it[, ms per PHASES])
               "frames_after": after,
               **({"phases": PHASES} if phases is not None else {})}
        print(json.dumps({k: v for k, v in row.items() if k not in ("frames", "frames_after")}), flush=True)
        rows.append(row)
        session.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = "-".join("".join(c for c in o if c.isalnum()) for o in (args.only or ["all"])) + time.strftime("-%H%M%S")
    (out / f"load_in_background_{slug}_{args.mode}_{threads}_{loader.UPLOAD_THREADS}_{switch}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

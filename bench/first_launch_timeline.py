"""Where a first launch's time goes, phase by phase, in a fresh process as a game has it: each
package is compiled here, written to a file, then loaded by a child process of its own (its
driver warmed as a game's is, bench/driver_start.py; the driver's shader cache empty unless
--keep-cache). The child wraps the runtime's loading functions and prints, per phase, when it
first started and last ended (seconds since Session() was called), how often it ran and its
summed time, on any thread (phases nest: Package._open holds _head, which holds
check_layout; GpuObjects.pipeline calls GpuObjects.layout: their sums overlap); and the Session's
whole time. A phase is named by the function it times (GpuObjects.pipeline, Loader._upload, ...;
runtimes from before runtime/loader.py and runtime/gpu_objects.py: Session._pipeline, _upload, ...).

    python bench/first_launch_timeline.py [--only NAME ...] [--quick-start] [--repeat N] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# (module, owner, name): the loading steps timed in the child; those a runtime lacks are skipped (the
# entries of session.py and package.py's older names: runtimes from before runtime/loader.py, measured
# against this one)
PHASES = [
    ("package", "Package", "_open"), ("package", None, "_head"), ("package", None, "validate_manifest"),
    ("package", None, "check_layout"), ("package", None, "check_programs"),
    ("loader", None, "check_buffers"), ("session", None, "check_buffers"),
    ("package", None, "_mapped"),
    ("package", None, "check_blob"), ("package", None, "weights_layout"),  # (weights_blob.py's, as package.py calls them)
    ("package", None, "_check_blob"), ("package", None, "_weights_layout"),  # (older runtimes: package.py's own)
    ("threads", "FileReader", "into"),
    ("loader", None, "check_device"), ("session", None, "check_device"),
    ("session", "Session", "_check_device"),  # (older runtimes: a method)
    ("loader", None, "check_workgroup_memory"), ("session", None, "check_workgroup_memory"),
    ("gpu_objects", "GpuObjects", "layout"), ("gpu_objects", "GpuObjects", "pipeline"),
    ("gpu_objects", "GpuObjects", "allocate"), ("loader", "Loader", "_upload"), ("tiers", None, "forms"),
    ("gpu_objects", "GpuObjects", "bind_group"),
    ("session", "Session", "_layout"), ("session", "Session", "_pipeline"), ("session", "Session", "_allocate"),
    ("session", "Session", "_upload"), ("session", "Session", "_forms"), ("session", "Session", "_bind_group"),
    ("loader", None, "make_bind_groups"), ("loader", None, "assemble"),  # (the load's: loader.py's names for them)
    ("session", None, "make_bind_groups"), ("session", None, "assemble"),  # (older runtimes: session.py's)
    ("training_state", "TrainingState", "_make"),  # (after the load: its buffers, then its groups)
    ("tiers", None, "make_bind_groups"), ("tiers", None, "assemble"),  # (the tuned tier's: tiers.py's own calls)
]


def _wrap(spans, lock, t0, fn, name, is_classmethod=False):
    def timed(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            with lock:
                spans.setdefault(name, []).append((t - t0[0], time.perf_counter() - t0[0]))
    return classmethod(timed) if is_classmethod else timed


def child(path: str, quick_start: bool, switch_interval: float | None) -> dict:
    import importlib

    from meganeura.runtime import Session
    from meganeura.runtime.device import default_device

    spans, lock, t0, originals = {}, threading.Lock(), [time.perf_counter()], []
    for mod_name, owner, name in PHASES:
        try:
            mod = importlib.import_module(f"meganeura.runtime.{mod_name}")
        except ImportError:  # (an older runtime, measured against this one)
            continue
        target = getattr(mod, owner) if owner else mod
        if name not in target.__dict__:  # (a step an older runtime does not have)
            continue
        raw = target.__dict__[name]
        originals.append((target, name, raw))
        is_cm = isinstance(raw, classmethod)
        fn = raw.__func__ if is_cm else raw
        setattr(target, name, _wrap(spans, lock, t0, fn, f"{owner + '.' if owner else ''}{name}", is_cm))
    dev = default_device()
    sys.path.insert(0, str(Path(__file__).parent))
    import driver_start

    driver = driver_start.warm(dev)  # as a game's driver has started by the time it loads a model
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    t0[0] = time.perf_counter()
    s = Session(dev, path, quick_start=quick_start)
    session_s = time.perf_counter() - t0[0]
    tier = s.tier
    s.programs  # noqa: B018  (waits for the training state, where the runtime makes it after the load)
    training_s = time.perf_counter() - t0[0]
    s.wait_tuned()
    tuned_s = time.perf_counter() - t0[0]
    # the tuned tier's bind groups once more, unwrapped, on this thread with nothing beside it
    for target, name, raw in originals:
        setattr(target, name, raw)
    if hasattr(s, "_objects"):  # (runtime/gpu_objects.py, runtime/tiers.py)
        from meganeura.runtime import tiers

        planned, bind = tiers.forms(s._manifest, s.device_class), s._objects.bind_group
    else:  # (older runtimes: the Session's methods, a key's fields as arguments)
        planned, bind = s._forms(s.device_class), lambda p, j, key: s._bind_group(p, j, *key)
    keys = {key: (p, j) for p, steps in planned.items() for j, (_, key) in enumerate(steps)}
    t = time.perf_counter()
    for key, (p, j) in keys.items():
        bind(p, j, key)
    alone_us = (time.perf_counter() - t) / max(1, len(keys)) * 1e6
    phases = {k: [round(min(a for a, _ in v), 4), round(max(b for _, b in v if b <= session_s) if any(
        b <= session_s for _, b in v) else -1, 4), sum(b <= session_s for _, b in v),
        round(sum(b - a for a, b in v if b <= session_s), 4)] for k, v in spans.items()}
    after = {k: [round(min(a for a, b in v if b > session_s), 4), round(max(b for _, b in v), 4),
                 sum(b > session_s for _, b in v), round(sum(b - a for a, b in v if b > session_s), 4)]
             for k, v in spans.items() if any(b > session_s for _, b in v)}
    s.close()
    return {"session_s": round(session_s, 4), "tier": tier, "training_ready_s": round(training_s, 4),
            "tuned_s": round(tuned_s, 4), "driver_start": driver,
            "bind_group_alone_us": round(alone_us, 1), "switch_interval": sys.getswitchinterval(),
            "phases (first start, last end within the load, calls, summed s)": phases,
            "after the load: the training state, the tuned tier (first start, last end, calls, summed s)": after}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--quick-start", action="store_true")
    ap.add_argument("--keep-cache", action="store_true", help="the driver's shader cache as it is (a later launch)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--switch-interval", type=float, help="sys.setswitchinterval in the child before it loads")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="out/bench")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.quick_start, args.switch_interval)))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from load_profile import compiled_packages

    rows = []
    for name, path in compiled_packages(args.only):
        for r in range(args.repeat):
            env = dict(os.environ)
            cmd = [sys.executable, __file__, "--child", str(path)] + (["--quick-start"] if args.quick_start else []) + \
                (["--switch-interval", str(args.switch_interval)] if args.switch_interval is not None else [])
            with tempfile.TemporaryDirectory() as cache:
                if not args.keep_cache:
                    env["__GL_SHADER_DISK_CACHE_PATH"] = cache
                out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if out.returncode:
                print(out.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{name}: the child failed")
            row = {"workload": name, "run": r, "quick_start": args.quick_start, **json.loads(out.stdout.splitlines()[-1])}
            print(json.dumps(row), flush=True)
            rows.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_launch_timeline.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

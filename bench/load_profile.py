"""Where a package's load time goes on this device: Package.load (read + checks), then
Session's phases (buffers, weight upload, pipelines, bind groups: runtime/gpu_objects.py's
GpuObjects.allocate, pipeline, bind_group and runtime/loader.py's Loader._upload), per workload, with
per-kernel pipeline times (made on loader.LOAD_THREADS threads, beside the upload) and a second Session (the
driver's shader cache warm). Random weights, no PyTorch.

    python bench/load_profile.py [--only NAME ...] [--threads N ...] [--upload-threads N] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import compile_times


# the Session's loading steps timed, each under the name the results give it: (owner, attribute, name)
# (`_upload`, not the writes: they run on threads, and their sum is no time anyone waits)
def _phases() -> list:
    from meganeura.runtime.gpu_objects import GpuObjects
    from meganeura.runtime.loader import Loader

    return [(GpuObjects, "allocate", "_allocate"), (Loader, "_upload", "_upload"),
            (GpuObjects, "pipeline", "_pipeline"), (GpuObjects, "bind_group", "_bind_group")]


def _timed(phases, acc):
    for cls, attr, k in phases:
        f = getattr(cls, attr)

        def g(*a, _f=f, _k=k, **kw):
            t = time.perf_counter()
            try:
                return _f(*a, **kw)
            finally:
                acc.setdefault(_k, []).append(time.perf_counter() - t)
                # (when, since the Session began, each call started and ended: the first tier's timeline)
                acc.setdefault("spans", {}).setdefault(_k, []).append((t - acc.get("t0", t), time.perf_counter() - acc.get("t0", t)))
                if _k == "_pipeline":  # (self, index, KernelInfo): which kernels the driver is slow on
                    acc.setdefault("kernels", []).append((acc[_k][-1], a[2].label or "", len(a[2].wgsl),
                                                          kernel_kind(a[2].wgsl)))
        setattr(cls, attr, g)


def _restore(originals: dict) -> None:
    for (cls, attr), f in originals.items():
        setattr(cls, attr, f)


def kernel_kind(wgsl: str) -> str:
    """Which family a kernel is (the driver's compile time differs by an order of magnitude)."""
    return "gemm 8x8/thread" if "acc0l" in wgsl else "gemm quick" if "quick_a[" in wgsl else \
        "gemm 4x4/thread" if "a_tile" in wgsl else \
        "attention" if "attention" in wgsl[:400] else "other"


def _workloads():
    """compile_times' workloads and bench/run.py's ResNet-50 (batch 16)."""
    yield from compile_times.workloads()
    from meganeura.compiler import TrainConfig
    from meganeura.compiler.models import resnet

    yield "ResNet-50 224 (b16, as bench/run.py)", lambda: resnet.resnet50(batch=16), \
        TrainConfig(loss="cross_entropy", optimizer="adamw")


def add_session_flags(ap) -> None:
    """The Session's load settings a load benchmark may change (apply_session_flags sets them)."""
    ap.add_argument("--upload-threads", type=int, default=None, help="threads writing the weights, whatever their size (default: loader.UPLOAD_THREADS, doubled from BIG_UPLOAD bytes)")
    ap.add_argument("--bind-group-threads", type=int, default=None, help="loader.BIND_GROUP_THREADS (default: as set)")


def apply_session_flags(args) -> None:
    from meganeura.runtime import loader
    from meganeura.runtime import session as session_module

    if args.upload_threads is not None:
        loader.UPLOAD_THREADS, loader.BIG_UPLOAD = args.upload_threads, float("inf")
    if args.bind_group_threads is not None:
        # the load's bind groups (loader.py) and the tuned tier's (session.py holds its own name for it)
        loader.BIND_GROUP_THREADS = session_module.BIND_GROUP_THREADS = args.bind_group_threads


def compile_options(plan=(), lift_sizes: bool = True, quick_divisors: bool = True):
    """CompileOptions from a benchmark's flags: `plan`, GEMM plan settings as KEY=INT strings
    (ValueError for a key the plan has not)."""
    from meganeura.compiler import CompileOptions

    defaults = CompileOptions().gemm
    gemm = {}
    for setting in plan:
        key, value = setting.split("=")
        if key not in defaults:
            raise ValueError(f"{setting}: the GEMM plan has no {key!r} (keys: {sorted(defaults)})")
        gemm[key] = type(defaults[key])(int(value))
    return CompileOptions(lift_sizes=lift_sizes, quick_divisors=quick_divisors).replace(gemm=gemm)


def compiled_packages(only, options=None):
    """(name, package file) for each workload whose name contains one of `only` (all when None),
    compiled as bench/run.py does (with `options`); each file is removed once the caller moves on."""
    from meganeura.compiler import compile_model

    for name, build, train in _workloads():
        if only and not any(o.lower() in name.lower() for o in only):
            continue
        path = Path(tempfile.mkdtemp()) / "p.mnpk"
        path.write_bytes(compile_model(build(), train, share_scratch=True, options=options))
        try:
            yield name, path
        finally:
            path.unlink()


def _parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--threads", nargs="*", type=int, default=[8])
    add_session_flags(ap)
    ap.add_argument("--all-kernels", action="store_true", help="every kernel's pipeline time, and sums per family")
    ap.add_argument("--no-lift-sizes", action="store_true", help="each size variant a kernel of its own")
    ap.add_argument("--unchecked", action="store_true", help="Session(shader_checks=False)")
    ap.add_argument("--device-class", default=None, help="Session(device_class=...): 'cpu' makes the CPU variants")
    ap.add_argument("--plan", nargs="*", default=[], metavar="KEY=VALUE",
                    help="GEMM plan settings for the compile (CompileOptions.gemm), e.g. k_unroll_long=2")
    ap.add_argument("--from-path", action="store_true",
                    help="the first Session made from the file (read while it compiles; session_s includes it)")
    ap.add_argument("--quick-start", action="store_true",
                    help="Session(quick_start=True): session_s until its quick tier runs, tuned_s until the tuned kernels "
                         "do; timeline is the first tier's, the pipeline sums and families cover both tiers")
    ap.add_argument("--quick-keep-divisors", action="store_true", help="CompileOptions(quick_divisors=False)")
    ap.add_argument("--warm-driver", action="store_true",
                    help="make a few pipelines, layouts and a buffer first, as a game has by the time it loads a model "
                         "(driver_start.py)")
    ap.add_argument("--out", default="out/bench")
    return ap


def _one_load(dev, name: str, path, threads: int, attempt: str, args, options, originals: dict) -> dict:
    """Load `path` once (a first or second attempt, the driver's cache then warm), each of the
    Session's phases timed: the row of the results."""
    from meganeura.runtime import Package, Session, loader

    acc = {}
    _restore(originals)
    _timed(_phases(), acc)
    t = time.perf_counter()
    pkg = path if args.from_path and attempt == "first" else Package.load(path)
    t1 = acc["t0"] = time.perf_counter()
    s = Session(dev, pkg, device_class=args.device_class, shader_checks=not args.unchecked,
                quick_start=args.quick_start)
    pkg = s.package
    t2 = time.perf_counter()
    tier, first_kernels = s.tier, len(s.kernels)
    # each phase's first start and last end within the first tier (seconds since the Session began)
    # (first start, last end, calls, their summed seconds)
    timeline = {k: (round(min(a for a, _ in v), 4), round(max(b for a, b in v if b <= t2 - t1), 4),
                    sum(b <= t2 - t1 for _, b in v), round(sum(b - a for a, b in v if b <= t2 - t1), 4))
                for k, v in acc.get("spans", {}).items() if any(b <= t2 - t1 for _, b in v)}
    s.wait_tuned()
    tuned = time.perf_counter() - t1
    kernels = len(s.kernels)
    per_kernel = sorted(acc.get("_pipeline", []))
    row = {"workload": name, "lift_sizes": options.lift_sizes, "threads": threads, "plan": args.plan, "from_path": args.from_path and attempt == "first", "checks": not args.unchecked, "device_class": s.device_class,
           "upload_threads": s.upload_threads, "bind_group_threads": loader.BIND_GROUP_THREADS,
           "attempt": attempt, "tier": tier, "quick_divisors": options.quick_divisors, "first_tier_kernels": first_kernels, "tuned_s": tuned,
           "timeline": timeline,
           "package_mb": pkg.raw_size / 2**20, "kernels": kernels,
           "dispatches": sum(len(p) for p in s.programs.values()),
           "package_load_s": t1 - t, "session_s": t2 - t1,
           **{f"{k.strip('_')}_s": sum(v) for k, v in acc.items() if k not in ("_pipeline", "_bind_group", "kernels", "spans", "t0")},
           "bind_groups": len(acc.get("_bind_group", [])),
           "pipeline_ms_median": 1e3 * per_kernel[len(per_kernel) // 2] if per_kernel else None,
           "pipeline_ms_max": 1e3 * per_kernel[-1] if per_kernel else None,
           "pipeline_ms_sum": 1e3 * sum(per_kernel),
           "slowest_kernels": [(label, round(1e3 * dt, 1), size) for dt, label, size, _ in
                               sorted(acc.get("kernels", []), reverse=True)[:8]]}
    families = {}
    for dt, _, _, kind in acc.get("kernels", []):
        n, ms = families.get(kind, (0, 0.0))
        families[kind] = (n + 1, ms + 1e3 * dt)
    row["families_count_ms"] = {k: (n, round(ms, 1)) for k, (n, ms) in sorted(families.items())}
    if args.all_kernels:
        row["kernels_ms"] = [(label, round(1e3 * dt, 2), size, kind)
                             for dt, label, size, kind in sorted(acc.get("kernels", []), reverse=True)]
    row["rest_s"] = row["session_s"] - row.get("allocate_s", 0) - row.get("upload_s", 0)  # waits for the threads
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    s.close()
    return row


def main(argv=None):
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        options = compile_options(args.plan, not args.no_lift_sizes, not args.quick_keep_divisors)
    except ValueError as e:
        ap.error(f"--plan {e}")
    from meganeura.runtime import loader
    from meganeura.runtime.device import default_device

    dev = default_device()
    if args.warm_driver:
        import driver_start

        print(json.dumps({"driver_start": driver_start.warm(dev)}), flush=True)
    apply_session_flags(args)
    originals = {(cls, attr): getattr(cls, attr) for cls, attr, _ in _phases()}
    rows = []
    for name, path in compiled_packages(args.only, options):
        for threads in args.threads:
            loader.LOAD_THREADS = threads
            for attempt in ("first", "second"):
                rows.append(_one_load(dev, name, path, threads, attempt, args, options, originals))
    _restore(originals)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "load_profile.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""Side-by-side benchmark: meganeura (wgpu, Vulkan) and PyTorch (CUDA eager, fp32, TF32 off)
on the same GPU in one process. Prints ratio tables and writes JSON.

    python bench/run.py [--out DIR] [--only NAME ...] [--iters N] [--budget S] [--smoke]
                        [--fast-paths [--no-compile | --compile-forward-only]]
    python bench/run.py --merge A/bench.json B/bench.json ... --out DIR

Ratios are meganeura / PyTorch: below 1 means meganeura is faster. Per workload: compile
time, package load time (Session construction: buffers, weights, every pipeline), GPU time
(timestamp queries around our one compute pass; CUDA events around torch's calls), wall
time, host CPU time per recorded dispatch, memory (our package's buffer bytes; torch's
max_memory_allocated over its model, optimizer and both programs), and the check that both
sides compute the same thing: the max relative error (max |ours - torch| / max |torch|) of
the inference output and of the first training step's loss. Beside our GPU time, the wall
time of one synchronous call through the public API (Session.run: upload, run, read back).

--fast-paths also times PyTorch's fast paths (torch_paths.py: TF32, bf16 autocast,
torch.compile, a CUDA graph of inference) and gives our GPU ratio against the fastest of them
and fp32 eager; --no-compile leaves torch.compile out (it takes seconds to minutes a model).
--merge joins the results of a run split across calls (--only) into one, summary and all.

--smoke swaps in tiny configurations (and runs torch on the CPU when there is no CUDA), so
that the whole harness runs on lavapipe in minutes.
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: F401  (registers the paper's workloads and DINOv2)
from timing import time_program, time_run, time_torch
from paths_report import fast_summary as _fast_summary, fast_table as _fast_table, fmt as _f
from paths_report import path_cell as _path_cell
from torch_paths import error_text, run_paths
from workloads import WORKLOADS, TorchSide

MATCH_TOL = 1e-3  # a max relative error above this is flagged: not the same computation
TARGETS = "train median <= 1.2x, none > 2x; inference median <= 1.0x; memory <= torch's on >= 4 of 5"


SESSION_OPTIONS = {}  # Session keyword arguments from the command line

# compiler settings the command line can change for an A/B run: flag -> (CompileOptions field,
# or (plan, key) of one of its tile plans; the value a switch sets (None: the flag takes a
# number); what it does)
EXPERIMENTS = {
    "--pointwise-conv-as-conv": ("pointwise_conv_as_matmul", False,
                                 "1x1 convolutions on the convolution kernels, not as matmuls"),
    "--no-sink-chains": ("sink_chains", False, "recomputed chains run where autodiff put them"),
    "--no-arenas": ("arenas", False, "each parameter, its gradient and its optimizer state in "
                    "buffers of their own; one update kernel per parameter"),
    "--k-unroll": (("gemm", "k_unroll"), None, "128-tiles: K steps per loop trip"),
    "--k-unroll-long": (("gemm", "k_unroll_long"), None,
                        "128-tiles whose slices span the plan's long_k or more: K steps per loop trip"),
    "--k-unroll-small": (("gemm", "k_unroll_small"), None, "64- and 32-tiles: K steps per loop trip"),
    "--no-lift-sizes": ("lift_sizes", False, "each size variant of a kernel a kernel of its own"),
    "--no-merge-quick": ("merge_quick", False, "each quick-tier kernel a pipeline of its own (not merged)"),
    "--big-bk": (("gemm", "big_bk"), None, "128-tile matmuls' K step (16 or 8)"),
    "--attention-fill": (("attention_backward", "fill"), None,
                         "workgroups the fused attention backward aims for by cutting its loops (0: whole loops)"),
}


def _compile_options(args):
    """The CompileOptions the command line asks for (EXPERIMENTS), and every experiment's
    value as compiled, for the results file."""
    from meganeura.compiler.options import CompileOptions

    changes, plans = {}, {}
    for flag, (setting, value, _) in EXPERIMENTS.items():
        given = getattr(args, flag[2:].replace("-", "_"))
        if given is None or given is False:
            continue
        value = value if value is not None else given
        if isinstance(setting, tuple):
            plans.setdefault(setting[0], {})[setting[1]] = value
        else:
            changes[setting] = value
    options = CompileOptions(share_scratch=not args.private_scratch, weights=args.weights).replace(**changes, **plans)
    settings = {}
    for setting, _, _ in EXPERIMENTS.values():
        name = ".".join(setting) if isinstance(setting, tuple) else setting
        settings[f"options.{name}"] = getattr(options, setting[0])[setting[1]] if isinstance(setting, tuple) \
            else getattr(options, setting)
    return options, settings


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"output shapes differ: meganeura {a.shape}, torch {b.shape}")
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _numpy(t):
    return t.detach().float().cpu().numpy()


def _load_settings() -> dict:
    """How Sessions load here: their thread counts, and whether the driver's shader cache
    starts empty (a folder of its own in __GL_SHADER_DISK_CACHE_PATH, as on a first launch)."""
    import os

    from meganeura.runtime import loader

    cache = os.environ.get("__GL_SHADER_DISK_CACHE_PATH")
    return {"load_threads": loader.LOAD_THREADS, "big_load_threads": loader.BIG_LOAD_THREADS,
            "upload_threads": loader.UPLOAD_THREADS,
            "upload_threads_from_bytes": [2 * loader.UPLOAD_THREADS, loader.BIG_UPLOAD],
            "shader_cache_empty_at_start": bool(cache) and os.path.isdir(cache) and not os.listdir(cache)}


def _round_torch_weights(module, names) -> int:
    """Round `module`'s state-dict tensors named `names` to f16 and back, in place; how many."""
    import torch

    if module is None:
        return 0
    state = module.state_dict()
    with torch.no_grad():
        for n in names:
            if n in state:
                state[n].copy_(state[n].half().float())
    return sum(n in state for n in names)


def _quick_runs(session, case) -> list:
    """[program, wall ms, tier before it, tier after it] of two runs of each program right after
    a quick_start load: what a host gets from the quick tier before the tuned kernels take over
    (a run whose tiers differ may have run on either)."""
    feeds = {"infer": {k: v for k, v in case.inputs.items() if k != "labels"}, "train_step": case.inputs}
    runs = []
    for program in [p for p in ("infer", "train_step") if p in session.programs] * 2:
        tier, t = session.tier, time.perf_counter()
        session.run(program, feeds[program])
        runs.append([program, (time.perf_counter() - t) * 1e3, tier, session.tier])
    return runs


def run_one(name, spec, args, device, tdev, options):
    import torch
    from meganeura.compiler import compile_model
    from meganeura.runtime import Package, Session

    cuda = tdev != "cpu"
    row = {"workload": name}
    t = time.perf_counter()
    case = spec(smoke=args.smoke)
    row.update(build_s=time.perf_counter() - t, config=case.config, paper=case.paper)
    row["parameters"] = int(sum(np.size(v) for v in case.model.params.values()))
    out_name = case.output or next(iter(case.model.graph.outputs))
    t = time.perf_counter()
    # the bench runs its programs one after the other, as a training loop does: their scratch
    # can be one pool (a frame scheduler interleaving them needs --private-scratch)
    half = args.weights == "f16"  # inference only: the bench's training steps train every weight (kept f32)
    data = compile_model(case.model, None if half else case.train, options=options)
    row["compile_s"] = time.perf_counter() - t
    case.model = None  # the builder's copy of the weights
    row["package_mb"] = len(data) / 2**20
    with tempfile.TemporaryDirectory() as tmp:  # a game loads its package from a file
        path = Path(tmp) / "model.mnpk"
        path.write_bytes(data)
        del data
        t = time.perf_counter()
        # a first launch: the file read and checked while the driver compiles every pipeline
        first = Session(device, path, **SESSION_OPTIONS, quick_start=args.quick_start)
        row["load_s"] = time.perf_counter() - t
        row["upload_threads"] = first.upload_threads
        if args.quick_start:  # how the quick tier runs, while the tuned kernels compile behind it
            row["load_tier"] = first.tier
            row["quick_runs"] = _quick_runs(first, case)
            first.wait_tuned()
            row["load_tuned_s"] = time.perf_counter() - t
        first.close()  # its buffers go before the next one's are made
        t = time.perf_counter()
        package = Package.load(path)
        row["package_read_s"] = time.perf_counter() - t
    row["gpu_bytes"] = int(package.manifest["memory"]["buffer_bytes"])
    row["f16_weights"] = sum(t["dtype"] == "f16" for t in package.manifest["tensors"])
    t = time.perf_counter()
    session = Session(device, package, **SESSION_OPTIONS)
    row["load_warm_s"] = time.perf_counter() - t  # a later launch (its package read apart): the driver's shader cache
    try:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        side = case.setup(tdev)
        side = side if isinstance(side, TorchSide) else TorchSide(*side)
        tfwd, ttrain = side
        infer_feed = {k: v for k, v in case.inputs.items() if k != "labels"}

        # the same computation? inference output, then the first training step's loss (same weights)
        ours_out = session.run("infer", infer_feed)[out_name]
        theirs_out = _numpy(tfwd())

        def err(theirs):
            return rel(ours_out.reshape(theirs.shape) if ours_out.size == theirs.size else ours_out, theirs)
        row["infer_rel_err"] = err(theirs_out)
        row["out_scale"] = float(np.abs(theirs_out).max())
        if half and cuda:  # PyTorch's f16 path beside ours: autocast (f16 tensor-core matmuls)
            def infer_fp16():
                with torch.autocast("cuda", dtype=torch.float16):
                    return tfwd()
            row["torch_fp16_rel_err"] = rel(_numpy(infer_fp16()), theirs_out)
        if half:  # the check: torch with the weights as the package stores them (rounded to f16)
            row["infer_rel_err_f32_weights"] = row["infer_rel_err"]
            row["f16_weights_in_torch"] = _round_torch_weights(
                getattr(case.setup, "module", None), [t["name"] for t in package.manifest["tensors"]
                                                      if t["dtype"] == "f16"])
            row["infer_rel_err"] = err(_numpy(tfwd()))
        del ours_out, theirs_out
        has_train = "train_step" in session.programs and ttrain is not None
        if has_train:
            ours_loss = float(np.asarray(session.run("train_step", case.inputs)["loss"]).reshape(-1)[0])
            theirs_loss = float(ttrain().item())
            row["loss"] = {"meganeura": ours_loss, "torch": theirs_loss, "rel_err": rel(ours_loss, theirs_loss)}

        kw = {"iters": args.iters, "budget_s": args.budget}
        for prog, tfn in (("infer", tfwd), ("train_step", ttrain if has_train else None)):
            if tfn is None:
                continue
            feed = case.inputs if prog == "train_step" else infer_feed
            ours = time_program(session, prog, feed, **kw)
            call = time_run(session, prog, feed, **kw)  # one synchronous call through the public API
            ours.update(session_run_wall_ms=call["wall_ms"], session_run_iters=call["iters"])
            theirs = time_torch(tfn, device=tdev, **kw)
            row[prog] = {"meganeura": ours, "torch": theirs,
                         "gpu_ratio": ours["gpu_ms"] / theirs["gpu_ms"] if ours["gpu_ms"] else None,
                         "wall_ratio": ours["wall_ms"] / theirs["wall_ms"]}
        if half and cuda:
            row["infer"]["torch_fp16_autocast"] = time_torch(infer_fp16, device=tdev, **kw)
            row["infer"]["gpu_ratio_vs_fp16_autocast"] = (row["infer"]["meganeura"]["gpu_ms"]
                                                          / row["infer"]["torch_fp16_autocast"]["gpu_ms"])
        if cuda:  # over the model, AdamW state and both programs; before any fast path's graphs and buffers
            torch.cuda.synchronize()
            row["torch_peak_bytes"] = int(torch.cuda.max_memory_allocated() - base)
        if args.fast_paths:
            for prog in ("infer", "train_step"):
                if prog in row:
                    _fast_paths_into(row[prog], run_paths(side, prog, tdev, lambda fn: time_torch(fn, device=tdev, **kw),
                                                          compile=not args.no_compile,
                                                          compile_step=not args.compile_forward_only))
            if case.torch_variants is not None:  # the fields DINOv2's rows had before: CUDA graph, torch.compile
                for vname, path in (("cuda_graph", "cuda_graph"), ("torch_compile", "compile")):
                    p = row["infer"]["torch_paths"].get(path, {})
                    if "gpu_ms" in p:
                        row["infer"][f"torch_{vname}"] = {k: p[k] for k in ("gpu_ms", "wall_ms", "iters", "made_s")}
                        row["infer"][f"gpu_ratio_vs_{vname}"] = p["gpu_ratio"]
            import torch._dynamo

            torch._dynamo.reset()  # compiled code holds this workload's modules; the next one compiles afresh
        elif cuda and case.torch_variants is not None:  # e.g. DINOv2: CUDA graph, torch.compile
            try:
                for vname, (fn, made_s) in case.torch_variants(tdev).items():
                    row["infer"][f"torch_{vname}"] = {**time_torch(fn, device=tdev, **kw), "made_s": made_s}
                    row["infer"][f"gpu_ratio_vs_{vname}"] = (row["infer"]["meganeura"]["gpu_ms"]
                                                              / row["infer"][f"torch_{vname}"]["gpu_ms"])
            except Exception as exc:  # noqa: BLE001  (torch.compile needs a C compiler and Triton: report, go on)
                row.setdefault("infer", {})["torch_variants_error"] = error_text(exc)
        if args.profile:  # after the timed loops: one pass per dispatch inflates nothing they measure
            from profile_program import profile, summarize

            row["profile"] = {prog: summarize(profile(session, prog, repeats=3)) for prog in session.programs
                              if prog in ("infer", "train_step")}
        row["notes"] = case.notes
    finally:
        session.close()
    return row


def _fast_paths_into(entry, paths):
    """A program's row entry with PyTorch's fast paths: each path's times and our GPU ratio to
    it, the fastest of them and fp32 eager (its name and GPU ms), and our ratio to that."""
    ours = entry["meganeura"]["gpu_ms"]
    for p in paths.values():
        if "gpu_ms" in p:
            p["gpu_ratio"] = ours / p["gpu_ms"] if ours else None
    timed = {"fp32": entry["torch"]["gpu_ms"], **{k: p["gpu_ms"] for k, p in paths.items() if "gpu_ms" in p}}
    fastest = min(timed, key=timed.get)
    entry.update(torch_paths=paths, fastest_torch=fastest, fastest_torch_gpu_ms=timed[fastest],
                 gpu_ratio_vs_fastest=ours / timed[fastest] if ours else None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--only", nargs="*", help=f"workloads to run, of: {' '.join(WORKLOADS)}")
    ap.add_argument("--iters", type=int, default=50, help="timed runs per program and side (at most)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds per timed loop, after which it stops early (default 6; 1 with --smoke)")
    ap.add_argument("--private-scratch", action="store_true",
                    help="compile each program's scratch buffers apart (as for a frame scheduler), not pooled")
    ap.add_argument("--profile", action="store_true",
                    help="also GPU time per dispatch, grouped by kernel label (bench.json's 'profile')")
    ap.add_argument("--smoke", action="store_true", help="tiny configurations; torch on the CPU without CUDA")
    ap.add_argument("--fast-paths", action="store_true",
                    help="also time PyTorch's fast paths (TF32, bf16 autocast, torch.compile, CUDA graph of inference; "
                         "torch_paths.py) and our GPU ratio against the fastest")
    ap.add_argument("--no-compile", action="store_true", help="with --fast-paths: leave torch.compile out")
    ap.add_argument("--compile-forward-only", action="store_true",
                    help="with --fast-paths: torch.compile the training step's forward only (backward and AdamW "
                         "eager), not the whole step function (whose compiled optimizer takes long on big models)")
    ap.add_argument("--merge", nargs="+", metavar="BENCH_JSON",
                    help="run nothing: join the rows of these bench.json files (one run split across calls with "
                         "--only) into one bench.json and bench.md in --out, the summary over all of them")
    for flag, (_, value, what) in EXPERIMENTS.items():
        if value is None:
            ap.add_argument(flag, type=int, default=None, help=f"experiment: {what}")
        else:
            ap.add_argument(flag, action="store_true", help=f"experiment: {what}")
    ap.add_argument("--weights", choices=("f32", "f16"), default="f32",
                    help="f16: inference-only packages with weights stored in half precision (compile_model's "
                         "weights='f16'); PyTorch's autocast f16 inference timed beside them")
    ap.add_argument("--warm-driver", action="store_true",
                    help="make a few pipelines, layouts and a buffer before the first workload, as a game has by the "
                         "time it loads a model: the driver's start-up in this process (info's driver_start, "
                         "driver_start.py) is then no workload's first launch")
    ap.add_argument("--quick-start", action="store_true",
                    help="the first launch as Session(quick_start=True): load_s until its quick tier runs, "
                         "load_tuned_s until the tuned kernels do, and the quick tier's run times")
    ap.add_argument("--no-shader-checks", action="store_true",
                    help="Session(shader_checks=False): kernels without the WGSL compiler's index clamps and "
                         "loop bounds (for packages one compiled oneself)")
    args = ap.parse_args(argv)
    if args.merge:
        return _merge(args.merge, Path(args.out))
    SESSION_OPTIONS["shader_checks"] = not args.no_shader_checks
    options, settings = _compile_options(args)
    if args.budget is None:
        args.budget = 1.0 if args.smoke else 6.0
    unknown = set(args.only or ()) - set(WORKLOADS)
    if unknown:
        ap.error(f"unknown workloads {sorted(unknown)}; there are {list(WORKLOADS)}")
    import torch
    import wgpu
    from meganeura.runtime.device import default_device

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tdev = "cuda" if torch.cuda.is_available() else "cpu"
    if tdev == "cpu" and not args.smoke:
        print("warning: no CUDA: torch runs on the CPU", file=sys.stderr)
    load_settings = _load_settings()  # before the device writes to the shader cache
    device = default_device()
    driver = None
    if args.warm_driver:
        import driver_start

        driver = driver_start.warm(device)
    info = {"date": time.strftime("%Y-%m-%d"), "gpu": device.adapter.info["device"],
            "driver": device.adapter.info.get("description", ""), "backend": device.adapter.info["backend_type"],
            "wgpu": wgpu.__version__, "torch": torch.__version__, "cuda": torch.version.cuda,
            "torch_device": torch.cuda.get_device_name(0) if tdev == "cuda" else "cpu",
            "python": platform.python_version(), "features": sorted(device.features), "smoke": args.smoke,
            "iters": args.iters, "budget_s": args.budget, "share_scratch": not args.private_scratch,
            "shader_checks": not args.no_shader_checks,
            "quick_start": args.quick_start, "driver_start": driver,
            "fast_paths": args.fast_paths and ("no torch.compile" if args.no_compile else
                                               "torch.compile of the training forward only"
                                               if args.compile_forward_only else "all"),
            "weights": args.weights, **settings, **load_settings}
    rows = []
    out = Path(args.out)
    for name, spec in WORKLOADS.items():
        if args.only and name not in args.only:
            continue
        t = time.perf_counter()
        try:
            row = run_one(name, spec, args, device, tdev, options)
        except Exception as exc:  # one broken workload must not hide the others
            traceback.print_exc()
            row = {"workload": name, "error": f"{type(exc).__name__}: {exc}"}
        row["total_s"] = time.perf_counter() - t
        rows.append(row)
        gc.collect()  # our buffers and torch's tensors of this workload go before the next one
        if tdev == "cuda":
            torch.cuda.empty_cache()
        print(_line(row), flush=True)
        out.mkdir(parents=True, exist_ok=True)  # after every workload, so a run cut short keeps what it measured
        (out / "bench.json").write_text(json.dumps({"info": info, "rows": rows, "partial": True}, indent=1))
    summary = _summary(rows)
    (out / "bench.json").write_text(json.dumps({"info": info, "rows": rows, "summary": summary}, indent=1))
    table = _table(info, rows, summary)
    (out / "bench.md").write_text(table)
    print(table)


def _merge(paths, out: Path):
    """One bench.json and bench.md from several runs' (workloads split across calls): their
    rows in order, the first run's info (with merged_from), the summary recomputed."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    info = {**runs[0]["info"], "merged_from": [str(p) for p in paths]}
    rows = [r for run in runs for r in run["rows"]]
    summary = _summary(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"info": info, "rows": rows, "summary": summary}, indent=1))
    table = _table(info, rows, summary)
    (out / "bench.md").write_text(table)
    print(table)


def _line(r):
    if "error" in r:
        return f"{r['workload']}: ERROR {r['error']}"
    parts = [r["workload"], f"package {r['package_mb']:.1f} MB ({r['f16_weights']} f16 weights), "
             f"compile {r['compile_s']:.2f}s first launch {r['load_s']:.2f}s "
             + (f"(quick tier; tuned {r['load_tuned_s']:.2f}s) " if "load_tuned_s" in r else "") +
             f"(warm: read {r['package_read_s']:.2f}s + load {r['load_warm_s']:.2f}s)",
             f"infer rel err {r['infer_rel_err']:.1e}" + (" MISMATCH" if r["infer_rel_err"] > MATCH_TOL else "")]
    if "loss" in r:
        parts.append(f"loss {r['loss']['meganeura']:.5g} vs {r['loss']['torch']:.5g} (rel {r['loss']['rel_err']:.1e})"
                     + (" MISMATCH" if r["loss"]["rel_err"] > MATCH_TOL else ""))
    for p in ("infer", "train_step"):
        if p in r:
            m, t = r[p]["meganeura"], r[p]["torch"]
            parts.append(f"{p}: gpu {_f(m['gpu_ms'])} vs {t['gpu_ms']:.3f} ms (x{_f(r[p]['gpu_ratio'], '.2f')}), "
                         f"wall {m['wall_ms']:.3f} vs {t['wall_ms']:.3f} ms ({m['dispatches']} dispatches, "
                         f"{m['iters']}/{t['iters']} iters), Session.run wall {_f(m.get('session_run_wall_ms'))} ms")
            if "torch_paths" in r[p]:
                parts.append(f"{p} fastest torch: {r[p]['fastest_torch']} {r[p]['fastest_torch_gpu_ms']:.3f} ms "
                             f"(x{_f(r[p]['gpu_ratio_vs_fastest'], '.2f')}); "
                             + ", ".join(f"{k} {_path_cell(v)}" for k, v in r[p]["torch_paths"].items()))
    if "infer_rel_err_f32_weights" in r:
        parts.append(f"vs torch's f32 weights {r['infer_rel_err_f32_weights']:.1e} "
                     f"({r['f16_weights_in_torch']} of {r['f16_weights']} f16 weights rounded in torch too)")
    if "torch_fp16_autocast" in r.get("infer", {}):
        parts.append(f"torch fp16 autocast {r['infer']['torch_fp16_autocast']['gpu_ms']:.3f} ms "
                     f"(x{r['infer']['gpu_ratio_vs_fp16_autocast']:.2f}; its rel err {r['torch_fp16_rel_err']:.1e})")
    mem = f"memory {r['gpu_bytes'] / 2**20:.1f} MiB"
    if r.get("torch_peak_bytes") is not None:
        mem += f" vs torch peak {r['torch_peak_bytes'] / 2**20:.1f} MiB"
    parts.append(mem)
    return " | ".join(parts) + f" | {r['total_s']:.0f}s"


def _summary(rows) -> dict:
    """The project's targets over the paper's five workloads."""
    paper = [r for r in rows if r.get("paper") and "error" not in r]
    train = [r["train_step"]["gpu_ratio"] for r in paper if r.get("train_step", {}).get("gpu_ratio") is not None]
    infer = [r["infer"]["gpu_ratio"] for r in paper if r.get("infer", {}).get("gpu_ratio") is not None]
    mem = [r["gpu_bytes"] <= r["torch_peak_bytes"] for r in paper if r.get("torch_peak_bytes") is not None]
    s = {"paper_workloads": [r["workload"] for r in paper],
         "train_gpu_ratio_median": float(np.median(train)) if train else None,
         "train_gpu_ratio_max": float(max(train)) if train else None,
         "infer_gpu_ratio_median": float(np.median(infer)) if infer else None,
         "memory_le_torch": sum(mem), "memory_compared": len(mem),
         "mismatches": [r["workload"] for r in rows if "error" not in r and (
             r["infer_rel_err"] > MATCH_TOL or r.get("loss", {}).get("rel_err", 0) > MATCH_TOL)]}
    s["targets_met"] = None if len(train) < 5 or len(infer) < 5 or len(mem) < 5 else {
        "train_median_le_1.2": s["train_gpu_ratio_median"] <= 1.2, "train_none_gt_2": s["train_gpu_ratio_max"] <= 2.0,
        "infer_median_le_1.0": s["infer_gpu_ratio_median"] <= 1.0, "memory_4_of_5": s["memory_le_torch"] >= 4}
    if any("torch_paths" in r.get(p, {}) for r in rows for p in ("infer", "train_step")):
        s.update(_fast_summary(rows, paper))
    return s


def _table(info, rows, summary):
    torch_side = "CPU" if info["torch_device"] == "cpu" else f"CUDA {info['cuda']}"
    lines = [f"# Benchmark {info['date']}{' (smoke: tiny configurations)' if info['smoke'] else ''}: {info['gpu']} "
             f"({info['backend']}, {info['driver']}), wgpu {info['wgpu']}, torch {info['torch']} {torch_side} "
             f"({info['torch_device']}), fp32 (TF32 off); at most {info['iters']} timed runs or {info['budget_s']:g} s "
             "per program and side", "",
             "| workload | program | meganeura GPU ms | torch GPU ms | GPU ratio | meganeura wall ms | torch wall ms "
             "| wall ratio | Session.run wall ms | dispatches | encode us/dispatch | runs (ours/torch) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workload']} | error: {r['error'][:100]} |")
            continue
        for p in ("infer", "train_step"):
            if p not in r:
                continue
            m, t = r[p]["meganeura"], r[p]["torch"]
            lines.append(f"| {r['workload']} | {p} | {_f(m['gpu_ms'])} | {t['gpu_ms']:.3f} | "
                         f"{_f(r[p]['gpu_ratio'], '.2f')} | {m['wall_ms']:.3f} | {t['wall_ms']:.3f} | "
                         f"{r[p]['wall_ratio']:.2f} | {_f(m.get('session_run_wall_ms'))} | {m['dispatches']} | "
                         f"{m['encode_us_per_dispatch']:.1f} | "
                         f"{m['iters']}/{t['iters']} |")
    pool = "scratch pooled across programs" if info.get("share_scratch") else "scratch private per program"
    lines += ["", f"| workload | parameters | compile s | package read s | load s: first launch from the file / warm, from a read package | meganeura buffers MiB "
              f"({pool}) | torch peak MiB | infer max rel err | loss (ours / torch) | configuration |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            continue
        peak = r.get("torch_peak_bytes")
        loss = r.get("loss")
        lines.append(f"| {r['workload']} | {r['parameters'] / 1e6:.2f} M | {r['compile_s']:.2f} | "
                     f"{r['package_read_s']:.2f} | {r['load_s']:.2f} / {r['load_warm_s']:.2f} | "
                     f"{r['gpu_bytes'] / 2**20:.1f} | {'-' if peak is None else f'{peak / 2**20:.1f}'} | "
                     f"{r['infer_rel_err']:.1e}{' **MISMATCH**' if r['infer_rel_err'] > MATCH_TOL else ''} | "
                     + (f"{loss['meganeura']:.5g} / {loss['torch']:.5g} ({loss['rel_err']:.0e})" if loss else "-")
                     + f" | {r.get('config', '')} |")
    s = summary
    lines += ["", f"Summary over the paper's five workloads ({', '.join(s['paper_workloads']) or 'none ran'}); "
              f"targets: {TARGETS}.", "",
              f"- train step GPU ratio: median {_f(s['train_gpu_ratio_median'], '.2f')}, "
              f"max {_f(s['train_gpu_ratio_max'], '.2f')}",
              f"- inference GPU ratio: median {_f(s['infer_gpu_ratio_median'], '.2f')}",
              f"- meganeura buffers <= torch peak: {s['memory_le_torch']} of {s['memory_compared']}",
              f"- targets met: {s['targets_met'] if s['targets_met'] is not None else 'n/a (not all five measured)'}",
              f"- outputs that do not match torch (max rel err > {MATCH_TOL:g}): {s['mismatches'] or 'none'}"]
    for r in rows:
        inf = r.get("infer", {})
        for v in ("cuda_graph", "torch_compile"):
            if f"torch_{v}" in inf:
                lines.append(f"- {r['workload']} inference vs PyTorch {v.replace('_', ' ')}: "
                             f"{_f(inf['meganeura']['gpu_ms'])} vs {inf[f'torch_{v}']['gpu_ms']:.3f} ms GPU "
                             f"(x{_f(inf[f'gpu_ratio_vs_{v}'], '.2f')}; made in {inf[f'torch_{v}']['made_s']:.1f} s)")
        if "torch_variants_error" in inf:
            lines.append(f"- {r['workload']}: PyTorch's CUDA graph / torch.compile failed: {inf['torch_variants_error']}")
    if "infer_gpu_ratio_vs_fastest_median" in s:
        lines += _fast_table(info, rows, s)
    notes = {r["workload"]: r["notes"] for r in rows if r.get("notes")}
    if notes:
        lines += ["", "Torch side: " + "; ".join(f"{k}: {', '.join(f'{a} {b}' for a, b in v.items())}"
                                                  for k, v in notes.items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

"""What the driver's compile of each pipeline costs, one kernel at a time (no threads, so
each number is one kernel's), with and without wgpu's shader checks, and for the GEMM
kernels with fused epilogues also with the epilogue replaced by a plain store (how much of
their compile the epilogue is), their multiply-adds as fma() calls, and their operand loads
replaced by index arithmetic (how much of it the loads' im2col math is). For a first launch's load time (bench/load_profile.py times
the real, threaded load). Run with an empty driver shader cache (__GL_SHADER_DISK_CACHE_PATH
a fresh folder): every variant differs (the plain stores carry a literal of their own), so none
hits another's entry.

    python bench/pipeline_compile.py [--only NAME ...] [--plan KEY=INT ...] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_profile import compile_options, compiled_packages, kernel_kind  # noqa: E402


def plain_store(wgsl: str, tag: int) -> str | None:
    """A GEMM kernel with its epilogue taken out: store() and store4 write v to the output (the
    last read_write binding) and nothing else; None when the kernel has no epilogue. `tag` goes
    into a literal, so that two kernels differing only in their epilogues stay two texts (the
    driver would answer the second from its cache)."""
    head = re.search(r"fn store\(g: u32, slice: u32, m: u32, n: u32, v: f32\) \{\n", wgsl)
    if head is None or "ev0" not in wgsl[head.end():wgsl.index("\n}\n", head.end())]:
        return None
    out = re.findall(r"var<storage, read_write> (\w+)", wgsl)[-1]
    write = f"    {out}[(g * M + m) * N + n] = v + {tag}e-30;"
    bodies = {"fn store(": write, "fn store4(": "\n".join(
        write.replace(" n]", f" n0 + {i}u]").replace("= v +", f"= v4.{c} +") for i, c in enumerate("xyzw"))}
    for name, body in bodies.items():
        start = wgsl.index("{\n", wgsl.index(name)) + 2
        wgsl = wgsl[:start] + body + wgsl[wgsl.index("\n}\n", start):]
    return wgsl


_ACC = re.compile(r"(acc\w+) = \1 \+ (\w+)\.([xyzw]) \* (\w+);")


def fma_form(wgsl: str, tag: int) -> str | None:
    """The inner loop's multiply-adds written as fma() calls (does the driver compile those faster?)."""
    out, n = _ACC.subn(r"\1 = fma(vec4<f32>(\2.\3), \4, \1);", wgsl)
    return out if n else None


def cheap_loads(wgsl: str, tag: int) -> str | None:
    """load_a / load_b (and their vec4 forms) returning a value of their indices instead of
    reading the operands (wrong results: for the compile time of the loads' index math alone)."""
    bodies = {"fn load_a(": "f32(m + k)", "fn load_b(": "f32(k + n)",
              "fn load_a4(": "vec4<f32>(f32(m + k))", "fn load_b4(": "vec4<f32>(f32(k + n))"}
    hit = False
    for name, value in bodies.items():
        if name not in wgsl:
            continue
        start = wgsl.index("{\n", wgsl.index(name)) + 2
        wgsl = wgsl[:start] + f"    return {value} + {tag}e-30;" + wgsl[wgsl.index("\n}\n", start):]
        hit = True
    return wgsl if hit else None


PROBES = {"plain_store": plain_store, "fma": fma_form, "cheap_loads": cheap_loads}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=["ResNet-50 224 (b16"])
    ap.add_argument("--plan", nargs="*", default=[], metavar="KEY=INT",
                    help="GEMM plan settings to compile with (CompileOptions.gemm, e.g. k_unroll=1 k_unroll_small=1)")
    ap.add_argument("--no-lift-sizes", action="store_true", help="each size variant a kernel of its own")
    ap.add_argument("--checked-only", action="store_true", help="each kernel once, as a Session makes it (no probes)")
    ap.add_argument("--variant", default="gpu", choices=("gpu", "cpu", "quick"),
                    help="which kernels: the GPU's, CPU rasterisers', or the quick tier's (Session(quick_start=True))")
    ap.add_argument("--quick-keep-divisors", action="store_true", help="CompileOptions(quick_divisors=False)")
    ap.add_argument("--out", default="out/bench")
    args = ap.parse_args(argv)
    try:
        options = compile_options(args.plan, not args.no_lift_sizes, not args.quick_keep_divisors)
    except ValueError as e:
        ap.error(f"--plan {e}")
    from meganeura.runtime import Package
    from meganeura.runtime.device import default_device
    from meganeura.runtime.native import shader_module
    from meganeura.runtime.package import kernels_of

    dev = default_device()

    def made(code: str, checked: bool) -> float:
        t = time.perf_counter()
        module = shader_module(dev, code, "probe", checked)
        dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        return 1e3 * (time.perf_counter() - t)

    rows = []
    for name, path in compiled_packages(args.only, options):
        m = Package.load(path).manifest
        used = sorted(kernels_of(m, args.variant))
        per = []
        for i in used:
            k = m["kernels"][i]
            row = {"label": k["label"], "kind": kernel_kind(k["wgsl"]), "chars": len(k["wgsl"]),
                   "checked_ms": made(k["wgsl"], True),
                   "unchecked_ms": None if args.checked_only else made(k["wgsl"], False)}
            for probe, transform in ({} if args.checked_only else PROBES).items():
                text = transform(k["wgsl"], i)
                if text is not None:
                    row[f"{probe}_checked_ms"] = made(text, True)
            per.append(row)
        sums = {}
        for r in per:
            s = sums.setdefault(r["kind"], {"count": 0, "checked_ms": 0.0, "unchecked_ms": None if args.checked_only else 0.0,
                                            "with_epilogue": 0, "epilogue_checked_ms": 0.0, "plain_store_checked_ms": 0.0})
            s["count"] += 1
            s["checked_ms"] += r["checked_ms"]
            if not args.checked_only:
                s["unchecked_ms"] += r["unchecked_ms"]
            if "plain_store_checked_ms" in r:
                s["with_epilogue"] += 1
                s["epilogue_checked_ms"] += r["checked_ms"]
                s["plain_store_checked_ms"] += r["plain_store_checked_ms"]
            for probe in ("fma", "cheap_loads"):
                if f"{probe}_checked_ms" in r:
                    s[f"{probe}_count"] = s.get(f"{probe}_count", 0) + 1
                    s[f"{probe}_before_ms"] = s.get(f"{probe}_before_ms", 0.0) + r["checked_ms"]
                    s[f"{probe}_checked_ms"] = s.get(f"{probe}_checked_ms", 0.0) + r[f"{probe}_checked_ms"]
        summary = {"workload": name, "plan": args.plan, "variant": args.variant,
                   "quick_divisors": options.quick_divisors, "lift_sizes": options.lift_sizes, "kernels": len(per), "families": sums,
                   "checked_ms": sum(r["checked_ms"] for r in per), "unchecked_ms": None if args.checked_only else sum(r["unchecked_ms"] for r in per)}
        print(json.dumps(summary), flush=True)
        rows.append({**summary, "per_kernel": per})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pipeline_compile.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

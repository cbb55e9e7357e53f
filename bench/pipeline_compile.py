"""What the driver's compile of each pipeline costs, one kernel at a time (no threads, so
each number is one kernel's), with and without wgpu's shader checks, and for the GEMM
kernels with fused epilogues also with the epilogue replaced by a plain store (how much of
their compile the epilogue is). For a first launch's load time (bench/load_profile.py times
the real, threaded load). Run with an empty driver shader cache (__GL_SHADER_DISK_CACHE_PATH
a fresh folder): every variant's text differs, so none hits another's entry.

    python bench/pipeline_compile.py [--only NAME ...] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_profile import _kind, _workloads  # noqa: E402


def plain_store(wgsl: str) -> str | None:
    """A GEMM kernel's store() with its epilogue replaced by a write of v to its output (the last
    read_write binding), or None when the kernel has no epilogue."""
    head = re.search(r"fn store\(g: u32, slice: u32, m: u32, n: u32, v: f32\) \{\n", wgsl)
    if head is None:
        return None
    end = wgsl.index("\n}\n", head.end())
    body = wgsl[head.end():end]
    if "ev0" not in body:
        return None
    out = re.findall(r"var<storage, read_write> (\w+)", wgsl)[-1]
    return wgsl[:head.end()] + f"    {out}[(g * M + m) * N + n] = v;" + wgsl[end:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=["ResNet-50 224 (b16"])
    ap.add_argument("--out", default="out/bench")
    args = ap.parse_args(argv)
    from meganeura.compiler import compile_model
    from meganeura.runtime import Package
    from meganeura.runtime.device import default_device
    from meganeura.runtime.native import unchecked_module
    from meganeura.runtime.session import _variant

    dev = default_device()

    def made(code: str, checked: bool) -> float:
        t = time.perf_counter()
        module = dev.create_shader_module(code=code) if checked else unchecked_module(dev, code, "probe")
        dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        return 1e3 * (time.perf_counter() - t)

    rows = []
    for name, build, train in _workloads():
        if args.only and not any(o.lower() in name.lower() for o in args.only):
            continue
        path = Path(tempfile.mkdtemp()) / "p.mnpk"
        path.write_bytes(compile_model(build(), train, share_scratch=True))
        m = Package.load(path).manifest
        used = sorted({_variant(d, "gpu")["kernel"] for p in m["programs"].values() for d in p["dispatches"]})
        per = []
        for i in used:
            k = m["kernels"][i]
            row = {"label": k["label"], "kind": _kind(k["wgsl"]), "chars": len(k["wgsl"]),
                   "checked_ms": made(k["wgsl"], True), "unchecked_ms": made(k["wgsl"], False)}
            plain = plain_store(k["wgsl"])
            if plain is not None:
                row["plain_store_checked_ms"] = made(plain, True)
            per.append(row)
        sums = {}
        for r in per:
            s = sums.setdefault(r["kind"], {"count": 0, "checked_ms": 0.0, "unchecked_ms": 0.0,
                                            "with_epilogue": 0, "epilogue_checked_ms": 0.0, "plain_store_checked_ms": 0.0})
            s["count"] += 1
            s["checked_ms"] += r["checked_ms"]
            s["unchecked_ms"] += r["unchecked_ms"]
            if "plain_store_checked_ms" in r:
                s["with_epilogue"] += 1
                s["epilogue_checked_ms"] += r["checked_ms"]
                s["plain_store_checked_ms"] += r["plain_store_checked_ms"]
        summary = {"workload": name, "kernels": len(per), "families": sums,
                   "checked_ms": sum(r["checked_ms"] for r in per), "unchecked_ms": sum(r["unchecked_ms"] for r in per)}
        print(json.dumps(summary), flush=True)
        rows.append({**summary, "per_kernel": per})
        path.unlink()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pipeline_compile.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

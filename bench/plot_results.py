"""Plots of a benchmark run for the documentation site: bench/results/*.json -> docs/benchmarks/.

    python bench/plot_results.py                 # the newest full run (see pick_run)
    python bench/plot_results.py --run bench/results/2026-11-30-h200.json

A full run is one of `bench/run.py`'s result files: every workload measured both ways on one GPU
(no --smoke), with PyTorch's side. Writes four SVG plots (GPU time per program, the ratio to
PyTorch, compile and first-launch times, GPU memory) and summary.md: the run's date, GPU, driver
and versions and a short table, which docs/benchmarks.md includes. The output is deterministic
(no dates or random ids in the SVGs), so an unchanged run rewrites identical files.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "docs" / "benchmarks"
PROGRAMS = {"infer": "inference", "train_step": "training step"}
OURS, THEIRS = "#1b9e77", "#7570b3"


def _full_run(path: Path) -> dict | None:
    """The parsed run, when `path` holds a full comparison run with PyTorch; else None."""
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("info"), dict) or data["info"].get("smoke", True):
        return None
    rows = [r for r in data.get("rows", []) if isinstance(r, dict) and "torch" in r.get("train_step", {})]
    return data if len(rows) >= 6 else None


def pick_run() -> Path:
    """The newest full run: by date, then by workloads measured, then the run the README quotes."""
    quoted = set(re.findall(r"bench/results/([\w.-]+)\.md", (ROOT / "README.md").read_text()))
    best, key = None, None
    for path in sorted(RESULTS.glob("*.json")):
        data = _full_run(path)
        if data is None:
            continue
        k = (data["info"].get("date", ""), len(data["rows"]), path.stem in quoted)
        if key is None or k > key:
            best, key = path, k
    if best is None:
        raise SystemExit(f"no full benchmark run in {RESULTS}")
    return best


def models(run: dict) -> list:
    """The rows of whole models (training step measured both ways), in the run's order."""
    return [r for r in run["rows"] if "torch" in r.get("train_step", {})]


def _label(row: dict) -> str:
    return row["workload"].replace("_", " ")


def _save(fig, ax, name: str) -> str:
    """Write `fig` as docs/benchmarks/NAME, with `ax`'s legend below the plots."""
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(OUT / name, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return name


def plot_gpu_times(rows: list) -> str:
    """GPU milliseconds per program, meganeura beside PyTorch, on a log scale."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.45 * len(rows) + 1.6), sharey=True)
    ys = range(len(rows))
    for ax, (program, title) in zip(axes, PROGRAMS.items()):
        ours = [r[program]["meganeura"]["gpu_ms"] for r in rows]
        theirs = [r[program]["torch"]["gpu_ms"] for r in rows]
        ax.barh([y - 0.2 for y in ys], ours, 0.4, color=OURS, label="meganeura (WGSL, Vulkan)")
        ax.barh([y + 0.2 for y in ys], theirs, 0.4, color=THEIRS, label="PyTorch (CUDA, eager)")
        ax.set_xscale("log")
        ax.set_title(f"{title}: GPU ms (lower is better)")
        ax.grid(axis="x", which="both", alpha=0.3)
    axes[0].set_yticks(list(ys), [_label(r) for r in rows])
    axes[0].invert_yaxis()
    return _save(fig, axes[0], "gpu-times.svg")


def plot_ratios(rows: list) -> str:
    """meganeura's GPU time over PyTorch's per workload and program; 1 is parity."""
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.8))
    ys = range(len(rows))
    for shift, (program, title), color in ((-0.2, ("infer", "inference"), OURS),
                                           (0.2, ("train_step", "training step"), "#d95f02")):
        ax.barh([y + shift for y in ys], [r[program]["gpu_ratio"] for r in rows], 0.4, color=color, label=title)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(list(ys), [_label(r) for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("meganeura GPU time / PyTorch GPU time (below 1: meganeura is faster)")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, ax, "gpu-ratio.svg")


def plot_start_times(rows: list) -> str:
    """Seconds to compile each model, and to make its Session from the file on a first launch."""
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.8))
    ys = range(len(rows))
    ax.barh([y - 0.2 for y in ys], [r["compile_s"] for r in rows], 0.4, color=OURS, label="compile (meganeura compile)")
    ax.barh([y + 0.2 for y in ys], [r["load_s"] for r in rows], 0.4, color="#e6ab02",
            label="first launch (Session from the file)")
    ax.set_yticks(list(ys), [_label(r) for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("seconds (log scale)")
    ax.grid(axis="x", which="both", alpha=0.3)
    return _save(fig, ax, "start-times.svg")


def plot_memory(rows: list) -> str:
    """GPU memory: meganeura's buffers (both programs) against PyTorch's peak."""
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.8))
    ys = range(len(rows))
    mib = 1 << 20
    ax.barh([y - 0.2 for y in ys], [r["gpu_bytes"] / mib for r in rows], 0.4, color=OURS, label="meganeura buffers")
    ax.barh([y + 0.2 for y in ys], [r["torch_peak_bytes"] / mib for r in rows], 0.4, color=THEIRS,
            label="PyTorch peak allocated")
    ax.set_yticks(list(ys), [_label(r) for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("MiB (log scale)")
    ax.grid(axis="x", which="both", alpha=0.3)
    return _save(fig, ax, "memory.svg")


def summary(run: dict, path: Path, rows: list) -> str:
    """Markdown: where the numbers come from, and a short table of them."""
    i = run["info"]
    source = (f"Run of {i['date']} on an {i['gpu']} ({i.get('backend', 'Vulkan')}, driver {i['driver']}): "
              f"wgpu {i['wgpu']}, PyTorch {i['torch']} (CUDA {i.get('cuda', '?')}), Python {i.get('python', '?')}; "
              f"f32 on both sides, at most {i.get('iters', '?')} timed runs per program. "
              f"Source: `bench/results/{path.name}`.")
    header = ("| workload | inference GPU ms (ours / PyTorch) | training step GPU ms (ours / PyTorch) "
              "| compile s | first launch s |")
    lines = [source, "", header, "|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r[p]['meganeura']['gpu_ms']:.3g} / {r[p]['torch']['gpu_ms']:.3g}" for p in PROGRAMS]
        lines.append(f"| {_label(r)} | {cells[0]} | {cells[1]} | {r['compile_s']:.2f} | {r['load_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="a result file of bench/run.py (default: the newest full run)")
    args = ap.parse_args(argv)
    path = args.run or pick_run()
    run = _full_run(path)
    if run is None:
        raise SystemExit(f"{path}: not a full benchmark run (bench/run.py without --smoke)")
    rows = models(run)
    OUT.mkdir(parents=True, exist_ok=True)
    plt.rcParams.update({"svg.hashsalt": "meganeura", "svg.fonttype": "none", "font.size": 9})
    written = [plot_gpu_times(rows), plot_ratios(rows), plot_start_times(rows), plot_memory(rows)]
    (OUT / "summary.md").write_text(summary(run, path, rows))
    print(f"{path.name} -> docs/benchmarks/: {', '.join(written)}, summary.md")


if __name__ == "__main__":
    main()

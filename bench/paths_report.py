"""bench/run.py's report of PyTorch's fast paths (--fast-paths): the summary against the fastest
path and its markdown tables."""
from __future__ import annotations

import numpy as np

FAST_TARGETS = "train median <= 0.8x, none > 1.0x; inference median <= 0.5x"  # against PyTorch's fastest path
FAST_COLUMNS = (("tf32", "TF32"), ("bf16_autocast", "bf16 autocast"), ("compile", "torch.compile"),
                ("cuda_graph", "CUDA graph"))


def fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def path_cell(p, times=False):
    """A fast path's result in a few characters: GPU ms (/ wall ms with `times`), or why none."""
    if "gpu_ms" in p:
        return f"{p['gpu_ms']:.3f}" + (f" / {p['wall_ms']:.3f}" if times else "")
    return "error" if "error" in p else f"skipped ({p['skipped']})"


def fast_summary(rows, paper) -> dict:
    """Our GPU ratio against PyTorch's fastest path: median (and training's max) over the
    paper's five workloads, medians over every workload measured, and the targets."""
    def ratios(sel, prog):
        return [r[prog]["gpu_ratio_vs_fastest"] for r in sel
                if r.get(prog, {}).get("gpu_ratio_vs_fastest") is not None]
    ok = [r for r in rows if "error" not in r]
    train, infer = ratios(paper, "train_step"), ratios(paper, "infer")
    s = {"train_gpu_ratio_vs_fastest_median": float(np.median(train)) if train else None,
         "train_gpu_ratio_vs_fastest_max": float(max(train)) if train else None,
         "infer_gpu_ratio_vs_fastest_median": float(np.median(infer)) if infer else None}
    for key, prog in (("train", "train_step"), ("infer", "infer")):
        every = ratios(ok, prog)
        s[f"{key}_gpu_ratio_vs_fastest_median_all"] = float(np.median(every)) if every else None
        s[f"{key}_gpu_ratio_vs_fastest_workloads_all"] = len(every)
    s["fast_targets_met"] = None if len(train) < 5 or len(infer) < 5 else {
        "train_median_le_0.8": s["train_gpu_ratio_vs_fastest_median"] <= 0.8,
        "train_none_gt_1.0": s["train_gpu_ratio_vs_fastest_max"] <= 1.0,
        "infer_median_le_0.5": s["infer_gpu_ratio_vs_fastest_median"] <= 0.5}
    return s


def fast_table(info, rows, s) -> list:
    """The markdown lines for PyTorch's fast paths: times, how each was made, the medians."""
    lines = ["", "PyTorch's fast paths (GPU ms / wall ms of one synchronous call; ratios are our GPU ms over "
             "theirs; the fastest among fp32 eager and the paths)" + (": torch.compile left out (--no-compile)"
                                                                    if info.get("fast_paths") == "no torch.compile"
                                                                    else ""), "",
             "| workload | program | meganeura GPU ms | Session.run wall ms | torch fp32 | "
             + " | ".join(title for _, title in FAST_COLUMNS) + " | fastest | ratio vs fp32 | ratio vs fastest |",
             "|---|---|---|---|---|" + "---|" * len(FAST_COLUMNS) + "---|---|---|"]
    made = ["", "How each path was made: seconds to make it (with its first calls: torch.compile's compile), "
            "its max rel err against fp32 eager at the same weights (inference output; training: the first "
            "step's loss)", "", "| workload | program | " + " | ".join(t for _, t in FAST_COLUMNS) + " |",
            "|---|---|" + "---|" * len(FAST_COLUMNS)]
    errors = []
    for r in rows:
        for p in ("infer", "train_step"):
            e = r.get(p, {})
            if "torch_paths" not in e:
                continue
            m, paths = e["meganeura"], e["torch_paths"]
            cells = [path_cell(paths[k], times=True) if k in paths else "-" for k, _ in FAST_COLUMNS]
            lines.append(f"| {r['workload']} | {p} | {fmt(m['gpu_ms'])} | {fmt(m.get('session_run_wall_ms'))} | "
                         f"{e['torch']['gpu_ms']:.3f} / {e['torch']['wall_ms']:.3f} | " + " | ".join(cells)
                         + f" | {e['fastest_torch']} | {fmt(e['gpu_ratio'], '.2f')} | "
                         f"{fmt(e['gpu_ratio_vs_fastest'], '.2f')} |")
            how = []
            for k, _ in FAST_COLUMNS:
                q = paths.get(k, {})
                if "made_s" in q:
                    how.append(f"{q['made_s']:.1f} s, {q['rel_err']:.1e}"
                               + (f" of {q['fp32_loss']:.3g}" if "fp32_loss" in q else "")
                               + (f" ({q['compiled']})" if "compiled" in q else ""))
                else:
                    how.append("-" if not q else path_cell(q))
                for key in ("error", "step_error"):
                    if key in q:
                        errors.append(f"- {r['workload']} {p} {k}{' (whole step)' if key == 'step_error' else ''}: "
                                      f"{q[key]}")
            made.append(f"| {r['workload']} | {p} | " + " | ".join(how) + " |")
    lines += made + ["", f"Against PyTorch's fastest path (targets: {FAST_TARGETS}):", "",
                     f"- over the paper's five: train step median {fmt(s['train_gpu_ratio_vs_fastest_median'], '.2f')}, "
                     f"max {fmt(s['train_gpu_ratio_vs_fastest_max'], '.2f')}; inference median "
                     f"{fmt(s['infer_gpu_ratio_vs_fastest_median'], '.2f')}; targets met: "
                     f"{s['fast_targets_met'] if s['fast_targets_met'] is not None else 'n/a (not all five measured)'}",
                     f"- over every workload measured: train step median "
                     f"{fmt(s['train_gpu_ratio_vs_fastest_median_all'], '.2f')} "
                     f"({s['train_gpu_ratio_vs_fastest_workloads_all']} workloads), inference median "
                     f"{fmt(s['infer_gpu_ratio_vs_fastest_median_all'], '.2f')} "
                     f"({s['infer_gpu_ratio_vs_fastest_workloads_all']} workloads)"]
    if errors:
        lines += ["", "Paths that failed:", ""] + errors
    return lines

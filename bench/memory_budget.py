"""Training within a memory budget (`--memory-budget`, compiler/passes/remat.py) on the GPU.

For DINOv2 ViT-S/14 (full fine-tune, with AdamW and with plain SGD) under 256 MiB and
ResNet-50 at batch 16 under half its unbudgeted step: each package's step peak (the bytes of the buffers the step binds), compile
time, GPU time per step, and the losses of STEPS steps from the same weights and inputs, which
must be equal bit for bit (rematerialisation recomputes the same values with the same
kernels). Beside them, PyTorch's peak for the same step (torch.cuda.max_memory_allocated),
plain and, for ResNet-50, with torch.utils.checkpoint over its four stages.

    python bench/memory_budget.py [--smoke] [--out results.json]

(--smoke: tiny configurations at the smallest budget they reach; a budget that cannot be
reached is recorded under "refused", and the package compiled at the smallest one instead.)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

STEPS = 5
# (workload, budget (None: half the unbudgeted peak), the training configuration's changes)
RUNS = {"dinov2_vits14": ("dinov2_vits14", 256 << 20, {}),  # AdamW: weights, gradients, 2 moments
        "dinov2_vits14_sgd": ("dinov2_vits14", 256 << 20, {"optimizer": "sgd", "momentum": 0.0}),
        "resnet50": ("resnet50", None, {})}


def measure(run: str, smoke: bool, device, torch_device) -> dict:
    import models  # noqa: F401  (registers the workloads)
    from meganeura.compiler import compile_model
    from meganeura.compiler.passes.remat import BudgetError
    from meganeura.runtime import Package, Session
    from meganeura.runtime.package_summary import step_bytes
    from timing import time_program
    from workloads import WORKLOADS

    name, budget, changes = RUNS[run]
    case = WORKLOADS[name](smoke=smoke)
    case.train = dataclasses.replace(case.train, **changes)
    row = {"config": case.config, "train": {k: getattr(case.train, k) for k in ("optimizer", "lr", "momentum")}}
    sessions = {}
    for kind in ("unbudgeted", "budgeted"):
        train = case.train
        if kind == "budgeted":
            budget = budget or row["unbudgeted"]["peak_bytes"] // 2
            train = dataclasses.replace(train, memory_budget=1 if smoke else budget)
        t = time.perf_counter()
        try:
            pkg = Package.from_bytes(compile_model(case.model, train))
        except BudgetError as exc:  # (the smallest budget reachable instead, and why)
            row["refused"] = {"budget": exc.budget, "reachable": exc.reachable, "floor": exc.floor}
            t = time.perf_counter()
            pkg = Package.from_bytes(compile_model(case.model, dataclasses.replace(train, memory_budget=exc.reachable)))
        compile_s = time.perf_counter() - t
        memory = pkg.parsed.training.memory
        row[kind] = {"compile_s": compile_s, "peak_bytes": step_bytes(pkg.parsed),
                     **({"budget": memory.budget, "rematerialised": memory.rematerialised,
                         "rematerialised_bytes": memory.rematerialised_bytes, "extra_flops": memory.extra_flops,
                         "step_flops": memory.step_flops} if memory else {})}
        sessions[kind] = Session(device, pkg)
    losses = {k: [float(np.asarray(s.run("train_step", case.inputs)["loss"]).reshape(-1)[0]) for _ in range(STEPS)]
              for k, s in sessions.items()}
    row["losses"] = losses
    row["losses_equal"] = losses["unbudgeted"] == losses["budgeted"]
    for kind, s in sessions.items():
        row[kind]["step"] = time_program(s, "train_step", case.inputs, iters=20, warmup=3, budget_s=20)
    row["torch"] = torch_peaks(case, name, torch_device) if not changes else {}
    return row


def torch_peaks(case, name: str, dev) -> dict:
    """PyTorch's peak bytes over a training step: plain, and (ResNet-50) with checkpoints."""
    import torch

    if dev == "cpu":
        return {}
    _, train_step = case.setup(dev)
    out = {}
    for kind in ("plain", "checkpointed") if name == "resnet50" else ("plain",):
        if kind == "checkpointed":
            checkpoint_stages(case.setup.module)
        train_step()  # (a warm step: the optimizer's state exists before the measured one)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        train_step()
        torch.cuda.synchronize()
        out[f"{kind}_peak_bytes"] = int(torch.cuda.max_memory_allocated())
    return out


def checkpoint_stages(model) -> None:
    """The ResNet twin's four stages run under torch.utils.checkpoint: what they hold for the
    backward is recomputed in it instead."""
    import torch
    import torch.utils.checkpoint as cp

    class Checkpointed(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return cp.checkpoint(self.inner, x, use_reentrant=False)

    for stage in ("layer1", "layer2", "layer3", "layer4"):
        setattr(model, stage, Checkpointed(getattr(model, stage)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny configurations (lavapipe, CPU torch)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--only", nargs="*", default=list(RUNS), choices=list(RUNS))
    args = ap.parse_args()
    import torch
    from meganeura.runtime.device import default_device

    device = default_device()
    tdev = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    rows = {"device": device.adapter.info["device"], "driver": device.adapter.info["description"],
            "torch": torch.__version__, "steps": STEPS, "workloads": {}}
    for name in args.only:
        r = measure(name, args.smoke, device, tdev)
        rows["workloads"][name] = r
        u, b = r["unbudgeted"], r["budgeted"]
        print(f"{name}: peak {u['peak_bytes'] / 2**20:.0f} -> {b['peak_bytes'] / 2**20:.0f} MiB "
              f"(budget {b['budget'] / 2**20:.0f} MiB), losses equal: {r['losses_equal']}, step "
              f"{u['step']['gpu_ms'] or 0:.2f} -> {b['step']['gpu_ms'] or 0:.2f} ms GPU, compile "
              f"{u['compile_s']:.2f} / {b['compile_s']:.2f} s, torch {r['torch']}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

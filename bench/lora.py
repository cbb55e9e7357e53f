"""LoRA fine-tuning of SmolLM2-135M (batch 4 x 128, next-token cross entropy), rank 8, alpha 16
(PEFT's common r=8 / lora_alpha=16; scale alpha / r = 2) on the attention projections (q_proj,
k_proj, v_proj, o_proj), against PyTorch with the same LoRA written out by hand: step time, memory and a ten-step
loss trajectory.

    python bench/lora.py [--smoke] [--json OUT] [--memory-budget 1GiB]

The model is bench/models.py's `smollm2_135m` (transformers' LlamaForCausalLM, random
initialisation, the same weights in our builder by state-dict name). Ours: compiled with
TrainConfig(lora_rank=8, lora_alpha=16, the four projections' weights as targets), AdamW at the
bench's lr 1e-3, a Session on the default device; the training step's GPU time (timestamp
queries, `time_program`) and `Session.run` wall time, and its buffer bytes as `meganeura info`
reports the step's peak (runtime/package_summary.py's `step_bytes`).

PyTorch: each target nn.Linear wrapped as base(x) + (alpha / r) * (x A^T) B^T, A and B
nn.Parameters holding the values our Session starts from (`Session.adapters()`, PEFT's names),
every base weight frozen; torch.optim.AdamW over the adapters with our TrainConfig's betas, eps
and weight decay. Steps timed with CUDA events in fp32 eager (TF32 off) and with bf16 autocast
(forward and loss; backward and AdamW outside it); peak memory is max_memory_allocated over the
model put on the GPU, the optimizer and the fp32 steps (the bf16 steps' own peak apart).

Both sides first take the same ten batches (fixed seed) in fp32 from the same start: the loss
trajectories side by side, their max absolute and relative difference, and the adapters' max
absolute difference after them. Then the timed loops, which keep training on the first batch.

--smoke: bench/models.py's tiny SmolLM2 (width 32, 2 layers, vocab 97, 2 x 16), torch on the CPU
(autocast as CPU autocast), ours on whatever adapter wgpu picks (lavapipe on a CPU machine).
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
RANK, ALPHA = 8, 16.0
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
TARGETS = [f"model.layers.*.self_attn.{m}.weight" for m in MODULES]
STEPS = 10  # the loss trajectory
ITERS, BUDGET_S = 20, 20.0  # each timed loop: at most ITERS runs or BUDGET_S seconds
GIB = 1 << 30


def _batches(n: int, batch: int, seq: int, vocab: int, seed: int = 0) -> list:
    """n batches of next-token prediction: seq + 1 random tokens per row, the input the first seq,
    the labels the last seq (every position's next token), flattened as the logits are."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tokens = rng.integers(0, vocab, (batch, seq + 1))
        out.append({"input_ids": tokens[:, :-1].astype(np.int32), "labels": tokens[:, 1:].reshape(-1).astype(np.int32)})
    return out


def _train_config(memory_budget=None):
    from meganeura.compiler import TrainConfig
    from models import LR

    return TrainConfig(loss="cross_entropy", optimizer="adamw", lr=LR, lora_rank=RANK, lora_alpha=ALPHA,
                       lora_targets=TARGETS, memory_budget=memory_budget)


def ours(model, cfg, batches: list, iters: int) -> tuple:
    """Compile, load, the loss trajectory, the step's timings and bytes; and the adapters'
    values (PEFT's names) at the start, for the PyTorch side, and after the trajectory."""
    from meganeura.compiler import compile_model
    from meganeura.runtime import Package, Session
    from meganeura.runtime.package_summary import step_bytes
    from timing import time_program, time_run

    t = time.perf_counter()
    data = compile_model(model, cfg)
    res = {"compile_s": time.perf_counter() - t}
    package = Package.from_bytes(data)
    del data
    t = time.perf_counter()
    session = Session(None, package)
    res["load_s"] = time.perf_counter() - t
    m = session.package.parsed
    lora = session.lora
    res["adapters"] = len(lora.adapters)
    res["lora_scale"] = lora.scale
    sizes = {tt.name: tt.count for tt in m.tensors if tt.role == "param"}
    res["trainable_values"] = sum(sizes[n] for a in lora.adapters for n in (a.a, a.b))
    res["values"] = sum(sizes.values())
    init = {k: np.array(v, np.float32) for k, v in session.adapters().items()}
    res["losses"] = [float(session.run("train_step", b)["loss"]) for b in batches]
    res["skipped_steps"] = int(session.skipped_steps)
    after = {k: np.array(v, np.float32) for k, v in session.adapters().items()}
    g = time_program(session, "train_step", batches[0], iters=iters, warmup=3, budget_s=BUDGET_S)
    r = time_run(session, "train_step", batches[0], iters=iters, warmup=2, budget_s=BUDGET_S)
    res.update(step_gpu_ms=g["gpu_ms"], step_record_wall_ms=g["wall_ms"], step_run_wall_ms=r["wall_ms"],
               dispatches=g["dispatches"], iters=g["iters"], encode_us_per_dispatch=g["encode_us_per_dispatch"],
               step_buffer_bytes=int(step_bytes(m)), package_buffer_bytes=int(package.manifest["memory"]["buffer_bytes"]))
    session.close()
    return res, init, after


def _lora_linear():
    import torch

    class LoraLinear(torch.nn.Module):
        """base(x) + scale * (x A^T) B^T, the base nn.Linear frozen: PEFT's Linear without dropout."""

        def __init__(self, base, a, b, scale):
            super().__init__()
            self.base, self.scale = base, scale
            self.lora_A = torch.nn.Parameter(a)
            self.lora_B = torch.nn.Parameter(b)

        def forward(self, x):
            return self.base(x) + self.scale * ((x @ self.lora_A.T) @ self.lora_B.T)
    return LoraLinear


def torch_side(ref, init: dict, cfg, batches: list, iters: int, dev: str) -> tuple:
    """ref (on the CPU) with the adapters `init` wrapped in, on `dev`: the fp32 loss trajectory,
    fp32 eager and bf16 autocast step times, peak memory; and the adapters' values after the
    trajectory (PEFT's names)."""
    import torch
    import torch.nn.functional as F
    from meganeura.runtime.adapters import PREFIX
    from timing import time_torch

    cuda = dev != "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    LoraLinear = _lora_linear()
    for p in ref.parameters():
        p.requires_grad_(False)
    m = ref.to(dev)
    modules = sorted({k[len(PREFIX):].rsplit(".lora_", 1)[0] for k in init})
    for name in modules:
        parent, attr = name.rsplit(".", 1)
        a = torch.tensor(init[f"{PREFIX}{name}.lora_A.weight"], device=dev)
        b = torch.tensor(init[f"{PREFIX}{name}.lora_B.weight"], device=dev)
        setattr(m.get_submodule(parent), attr, LoraLinear(m.get_submodule(name), a, b, cfg.lora_alpha / cfg.lora_rank))
    params = [p for p in m.parameters() if p.requires_grad]
    wd = 0.01 if cfg.weight_decay is None else cfg.weight_decay  # TrainConfig's AdamW default (training.py)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=wd)
    m.train()
    v = m.config.vocab_size
    feed = [(torch.tensor(b["input_ids"], dtype=torch.int64, device=dev),
             torch.tensor(b["labels"], dtype=torch.int64, device=dev)) for b in batches]

    def step(ids, labels, autocast=False):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
            logits = m(input_ids=ids, use_cache=False).logits.reshape(-1, v)
            loss = F.cross_entropy(logits, labels)
        loss.backward()
        opt.step()
        return loss

    res = {"adapters": len(modules), "trainable_values": sum(p.numel() for p in params),
           "attention": getattr(m.config, "_attn_implementation", None),
           "adamw": {"lr": cfg.lr, "betas": list(cfg.betas), "eps": cfg.eps, "weight_decay": wd,
                     "impl": "foreach" if cuda else "for-loop (cpu)"}}
    res["losses"] = [float(step(*f).item()) for f in feed]
    after = {f"{PREFIX}{name}.lora_{x}.weight": getattr(m.get_submodule(name), f"lora_{x}").detach().cpu().numpy().copy()
             for name in modules for x in "AB"}
    r = time_torch(lambda: step(*feed[0]), iters=iters, warmup=3, budget_s=BUDGET_S, device=dev)
    res["fp32"] = {"gpu_ms": r["gpu_ms"], "wall_ms": r["wall_ms"], "iters": r["iters"]}
    if cuda:
        torch.cuda.synchronize()
        res["peak_bytes"] = int(torch.cuda.max_memory_allocated() - base)
        torch.cuda.reset_peak_memory_stats()
    r = time_torch(lambda: step(*feed[0], autocast=True), iters=iters, warmup=3, budget_s=BUDGET_S, device=dev)
    res["bf16_autocast"] = {"gpu_ms": r["gpu_ms"], "wall_ms": r["wall_ms"], "iters": r["iters"]}
    if cuda:
        torch.cuda.synchronize()
        res["bf16_autocast"]["peak_bytes"] = int(torch.cuda.max_memory_allocated() - base)
    return res, after


def measure(smoke: bool, memory_budget=None) -> dict:
    import torch
    from models import smollm2_135m

    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    case = smollm2_135m(smoke=smoke)
    ref = case.setup.module  # the transformers twin, on the CPU, the weights our builder holds
    batch, seq = case.inputs["input_ids"].shape
    cfg = _train_config(memory_budget)
    batches = _batches(STEPS, batch, seq, ref.config.vocab_size)
    iters = 5 if smoke else ITERS
    model, case.model = case.model, None
    res = {"config": f"{case.config.split(', cross')[0]}, next-token cross entropy; LoRA rank {RANK}, alpha "
                     f"{ALPHA:g} (scale {ALPHA / RANK:g}) on {', '.join(MODULES)}; AdamW lr {cfg.lr}"
                     + (f"; ours with --memory-budget {memory_budget}" if memory_budget else ""),
           "torch_device": dev}
    res["ours"], init, ours_after = ours(model, cfg, batches, iters)
    del model
    res["torch"], torch_after = torch_side(ref, init, cfg, batches, iters, dev)
    # the adapters after the ten steps: the LoRA path itself followed PyTorch's, not only the loss
    # (which the adapters move little in ten steps from B = 0)
    res["adapter_max_abs_diff"] = float(max(np.abs(ours_after[k] - torch_after[k]).max() for k in torch_after))
    res["adapter_B_max_abs"] = float(max(np.abs(v).max() for k, v in torch_after.items() if ".lora_B." in k))
    a, b = np.array(res["ours"]["losses"]), np.array(res["torch"]["losses"])
    res["loss_max_abs_diff"] = float(np.abs(a - b).max())
    res["loss_max_rel_diff"] = float((np.abs(a - b) / np.abs(b)).max())
    o, t = res["ours"], res["torch"]
    gpu = o["step_gpu_ms"]
    res["ratios"] = {"gpu_vs_torch_fp32": gpu / t["fp32"]["gpu_ms"] if gpu else None,
                     "gpu_vs_torch_bf16_autocast": gpu / t["bf16_autocast"]["gpu_ms"] if gpu else None,
                     "run_wall_vs_torch_fp32_wall": o["step_run_wall_ms"] / t["fp32"]["wall_ms"]}
    peak = t.get("peak_bytes")
    res["targets"] = {"memory_le_1GiB": o["step_buffer_bytes"] <= GIB,
                      "memory_le_torch": o["step_buffer_bytes"] <= peak if peak else None,
                      "step_le_torch_fp32": gpu <= t["fp32"]["gpu_ms"] if gpu else None,
                      "losses_within_1e-3": res["loss_max_abs_diff"] <= 1e-3}
    return res


def _env(dev: str) -> dict:
    import torch
    import wgpu

    a = wgpu.gpu.request_adapter_sync(power_preference="high-performance").info
    env = {"date": time.strftime("%Y-%m-%d"), "gpu": a["device"], "wgpu_backend": a.get("backend_type", ""),
           "driver": a.get("description", ""), "wgpu": wgpu.__version__, "torch": torch.__version__,
           "python": platform.python_version()}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    if dev != "cpu":
        env["torch_gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        try:
            env["nvidia_driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                                  check=False, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return env


def _ms(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _mib(n) -> str:
    return "-" if n is None else f"{n / (1 << 20):.1f} MiB"


def markdown(res: dict) -> str:
    o, t, r, e = res["ours"], res["torch"], res["ratios"], res["env"]
    bf = t["bf16_autocast"]
    head = (f"{e['date']}, {e['gpu']} ({e.get('nvidia_driver') or e['driver']}), torch {e['torch']} on "
            f"{res['torch_device']}, wgpu {e['wgpu']}")
    rows = [("meganeura", o["step_gpu_ms"], f"{_ms(o['step_run_wall_ms'])} (Session.run)", None,
             f"{_mib(o['step_buffer_bytes'])} (step buffers)"),
            ("torch fp32 eager", t["fp32"]["gpu_ms"], _ms(t["fp32"]["wall_ms"]), r["gpu_vs_torch_fp32"],
             f"{_mib(t.get('peak_bytes'))} (peak)"),
            ("torch bf16 autocast", bf["gpu_ms"], _ms(bf["wall_ms"]), r["gpu_vs_torch_bf16_autocast"],
             f"{_mib(bf.get('peak_bytes'))} (peak)")]
    lines = [f"LoRA step, {res['config']}", "", head, "",
             "| | GPU ms | wall ms | ours GPU / this | memory |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {_ms(g)} | {w} | {'' if x is None else _ms(x)} | {mem} |" for n, g, w, x, mem in rows]
    lines += ["", "| step | loss ours | loss torch | diff |", "|---|---|---|---|"]
    lines += [f"| {i + 1} | {a:.6f} | {b:.6f} | {a - b:+.2e} |" for i, (a, b) in enumerate(zip(o["losses"], t["losses"]))]
    targets = ", ".join(f"{k} {v}" for k, v in res["targets"].items())
    lines += ["", (f"max |diff| {res['loss_max_abs_diff']:.2e}, max relative {res['loss_max_rel_diff']:.2e}; "
                   f"adapters after the ten steps: max |diff| {res['adapter_max_abs_diff']:.2e} "
                   f"(max |B| {res['adapter_B_max_abs']:.2e}); targets: {targets}")]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--memory-budget", help="compile our step to fit this many bytes (e.g. 1GiB)")
    args = ap.parse_args()
    res = measure(args.smoke, args.memory_budget)
    res["env"] = _env(res["torch_device"])
    print(json.dumps(res, indent=1))
    print(markdown(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
        Path(args.json).with_suffix(".md").write_text(markdown(res) + "\n")


if __name__ == "__main__":
    main()

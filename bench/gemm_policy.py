"""GEMM and attention plans on this GPU: each transformer-sized matmul (with its bias or
GELU epilogue) and attention of the bench's models, under several codegen_gemm.GEMM_PLAN /
codegen_attention.ATTENTION_PLAN settings, GPU time by timestamps, cuBLAS / SDPA beside them.
Picks the plan with the least total time; the defaults in codegen come from here.

    python bench/gemm_policy.py [--out DIR]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

GEMMS = [  # (m, k, n, epilogue): DINOv2 at 224 (257 tokens), Whisper-tiny (1500), SmolVLA (50 / 113), SmolLM2 (512)
    (257, 384, 384, "bias"), (257, 384, 1152, "bias"), (257, 384, 1536, "gelu"), (257, 1536, 384, "bias"),
    (1500, 384, 384, "bias"), (1500, 384, 1536, "gelu"), (1500, 1536, 384, "bias"),
    (50, 720, 720, "bias"), (50, 720, 2048, "none"), (50, 2048, 720, "none"), (113, 960, 320, "none"),
    (512, 576, 576, "none"), (512, 576, 1536, "none"), (512, 1536, 576, "none"),
    (4096, 4096, 4096, "none"), (4096, 4096, 4096, "plain"),  # "plain": x @ w with w [k, n], as bench/run.py's gemm_*
    (512, 576, 49152, "none"),  # SmolLM2's tied lm head
    (16, 64, 56, "conv3x3"),  # ResNet-50's stage-1 3x3 convolution at batch 16: (batch, channels, size)
    (16, 64, 56, "conv3x3_grad"), (16, 256, 14, "conv3x3_grad"),  # ... forward and both gradients (stages 1, 3)
    (16, 128, 28, "conv3x3"), (16, 256, 14, "conv3x3"), (16, 512, 7, "conv3x3"),  # stages 2-4 forward
    (16, 128, 28, "conv3x3_grad"), (16, 512, 7, "conv3x3_grad"),
]
ATTENTIONS = [(1, 6, 257, 257, 64), (1, 6, 1500, 1500, 64), (1, 12, 50, 163, 60), (4, 9, 128, 128, 64)]
_F = {"fill": 256, "short_k": 512, "slice_min": 64, "slice_min_short": 128, "k_fastest_staging": True,
      "big_split": 0, "regs64": False, "straight_staging": False, "conv_vec4_weights": False, "double_buffer": False,
      "warp_rows": 2, "warp_rows_small": 2, "k_rows_fastest": False,
      "tiles_2d": True, "k_unroll": 2, "k_unroll_small": 2, "store4": True,
      "k_unroll_long": 4, "long_k": 512, "split_groups": False, "split_k_quads": False}
# (each plan sets every key: plans run one after another; flat tiles before session 9, one K
# step per loop trip and no store4 before session 10, 128-tile rows as [group] before session
# 11. A result file names its plans as they were then: session 10's 4-step and two-buffer plans
# ran with 2 steps as the default)
_BIG = {"big_bk": 8,  # (16 before session 8: older result files measured these plans with 16)
        "prefetch": True, "vec4_loads": True, "big_bk_conv": 8, "vec4_small_tiles": True}
_DEFAULT = {**_F, **_BIG, "spread_a": False, "spread_b": True, "big_min_side": 128, "straight_staging": True}
GEMM_PLANS = {  # codegen_gemm.GEMM_PLAN settings (the default: "..., 128-tiles only when M, N >= 128")
    "F": {**_F, **_BIG, "spread_a": False, "spread_b": False, "big_min_side": 0},
    "F, 128-tiles: B groups 64 apart": {**_F, **_BIG, "spread_a": False, "spread_b": True, "big_min_side": 0},
    "F, 128-tiles: A and B groups 64 apart": {**_F, **_BIG, "spread_a": True, "spread_b": True, "big_min_side": 0},
    "F, B groups 64 apart, 128-tiles only when M, N >= 128": {**_F, **_BIG, "spread_a": False, "spread_b": True,
                                                              "big_min_side": 128, "big_split": 0},
    "... and split 128-tiles up to 8 ways": {**_F, **_BIG, "spread_a": False, "spread_b": True, "big_min_side": 128,
                                             "big_split": 8},
    "... (no split) and 64-tiles 8x8 per thread": {**_F, **_BIG, "spread_a": False, "spread_b": True,
                                                   "big_min_side": 128, "big_split": 0, "regs64": True},
    "... (no split) and straight staging on 64/32-tiles": {**_F, **_BIG, "spread_a": False, "spread_b": True,
                                                           "big_min_side": 128, "straight_staging": True},
    "... (no split) and convolution weights 16 bytes at a time": {**_F, **_BIG, "spread_a": False, "spread_b": True,
                                                                  "big_min_side": 128, "conv_vec4_weights": True},
    "... both": {**_F, **_BIG, "spread_a": False, "spread_b": True, "big_min_side": 128, "straight_staging": True,
                 "conv_vec4_weights": True},
    "straight staging (default)": {**_F, **_BIG, "spread_a": False, "spread_b": True, "big_min_side": 128,
                                   "straight_staging": True},
    "... and warps of 8 x 4 threads on 128-tiles": {**_DEFAULT, "warp_rows": 4},
    "... and on 64-tiles too": {**_DEFAULT, "warp_rows": 4, "warp_rows_small": 4},
    "... K-contiguous operands staged rows fastest": {**_DEFAULT, "k_rows_fastest": True},
    "... warps of 8 x 4 everywhere and rows fastest": {**_DEFAULT, "warp_rows": 4, "warp_rows_small": 4, "k_rows_fastest": True},
    "... 128-tile matmuls with K steps of 16": {**_DEFAULT, "big_bk": 16},
    "... flat tiles (k * groups + group)": {**_DEFAULT, "tiles_2d": False},
    "... one K step per loop trip": {**_DEFAULT, "k_unroll": 1, "k_unroll_small": 1},
    "... 128-tiles: 2 K steps per loop trip, however long K": {**_DEFAULT, "k_unroll_long": 2},
    "... results stored one at a time (no store4)": {**_DEFAULT, "store4": False},
    "... 128-tiles on two buffers, alternating by the steps of a loop trip": {**_DEFAULT, "double_buffer": True},
    "... 128-tiles' rows split [half][thread]": {**_DEFAULT, "split_groups": True},
    "... rows split, k by quads (the default since session 11)": {**_DEFAULT, "split_groups": True,
                                                                   "split_k_quads": True},
}
ITERS = 100
# attention backward (dQ, dK, dV of one attention): Whisper-tiny, DINOv2, SD-1.5's first level (self, cross)
ATTENTION_BACKWARDS = [(1, 6, 1500, 1500, 64), (1, 6, 257, 257, 64), (1, 8, 4096, 4096, 40), (1, 8, 4096, 77, 40)]
# codegen_attention.ATTENTION_BWD_PLAN settings, and "budget" (ops_layers.BACKWARD_BUDGET) and
# "fused" (False: the decomposition's gradient, scores in memory, GEMMs, softmax); fill: workgroups
# the fused kernels aim for by cutting their loops into chunks (0: whole loops)
_BWD = {"vec4_loads": False, "fill": 1056, "tiles_2d": True, "unroll": ("c", "jj", "ii"), "budget": 32768, "fused": True}
ATTENTION_BWD_PLANS = {"scalar loads": {**_BWD, "fill": 0}, "split to 528": {**_BWD, "fill": 528},
                       "split to 1056 (default)": _BWD,
                       "split to 1056, flat tiles": {**_BWD, "tiles_2d": False},
                       "split to 1056, loops kept": {**_BWD, "unroll": ()},
                       "split to 1056, columns unrolled": {**_BWD, "unroll": ("c",)},
                       "split to 1056, steps unrolled": {**_BWD, "unroll": ("jj", "ii")},
                       "split to 2112": {**_BWD, "fill": 2112},
                       "decomposed": {**_BWD, "vec4_loads": True, "fill": 0, "fused": False}}
ATTENTION_PLANS = {"fill 256": {"min_split_keys": 32, "fill": 256, "min_keys": 256, "tiles_2d": False},
                   "fill 1024": {"min_split_keys": 32, "fill": 1024, "min_keys": 256, "tiles_2d": False},
                   "fill 1024, from 64 keys": {"min_split_keys": 32, "fill": 1024, "min_keys": 64, "tiles_2d": False},
                   "fill 2048, from 64 keys": {"min_split_keys": 32, "fill": 2048, "min_keys": 64, "tiles_2d": False},
                   "fill 512, from 64 keys, [key][vec4] tiles":
                       {"min_split_keys": 32, "fill": 512, "min_keys": 64, "tiles_2d": True},
                   "fill 512, from 64 keys, flat tiles (attention default)":
                       {"min_split_keys": 32, "fill": 512, "min_keys": 64, "tiles_2d": False}}


def _gemm_model(m, k, n, epi):
    from meganeura.compiler import Builder

    rng = np.random.default_rng(0)
    b = Builder()
    if epi.startswith("conv3x3"):  # (batch, channels, size)
        x = b.input("x", (m, k, n, n))
        w = b.input("w", (k, k, 3, 3)) if epi == "conv3x3_grad" else \
            b.param("w", rng.standard_normal((k, k, 3, 3)) / np.sqrt(9 * k))
        y = b.conv2d(x, w, padding=(1, 1, 1, 1))
        b.output("y", y)
        inputs = {"x": rng.standard_normal((m, k, n, n)).astype(np.float32)}
        if epi == "conv3x3_grad":
            from meganeura.compiler.ir.autodiff import gradients

            ct = b.input("ct", y.shape)
            grads = gradients(b.e, b.sum(y * ct).id, [x.id, w.id])
            b.g.outputs.update(gx=grads[x.id], gw=grads[w.id])
            inputs.update(w=(rng.standard_normal((k, k, 3, 3)) / np.sqrt(9 * k)).astype(np.float32),
                          ct=rng.standard_normal(y.shape).astype(np.float32))
        return b.build(), inputs
    x = b.input("x", (m, k))
    if epi == "plain":
        y = b.matmul(x, b.param("w", rng.standard_normal((k, n)) / np.sqrt(k)))
    else:
        y = b.linear(x, b.param("w", rng.standard_normal((n, k)) / np.sqrt(k)),
                     b.param("b", rng.standard_normal(n)) if epi != "none" else None)
    b.output("y", b.gelu(y) if epi == "gelu" else y)
    return b.build(), {"x": rng.standard_normal((m, k)).astype(np.float32)}


def _attention_model(b_, h, s, t, d):
    from meganeura.compiler import Builder

    rng = np.random.default_rng(0)
    b = Builder()
    q, k, v = b.input("q", (b_, h, s, d)), b.input("k", (b_, h, t, d)), b.input("v", (b_, h, t, d))
    b.output("y", b.op("attention", q, k, v, causal=False))
    return b.build(), {n: rng.standard_normal(sh).astype(np.float32) for n, sh in
                       (("q", (b_, h, s, d)), ("k", (b_, h, t, d)), ("v", (b_, h, t, d)))}


def _attention_backward_model(b_, h, s, t, d):
    from meganeura.compiler import Builder
    from meganeura.compiler.ir.autodiff import gradients

    rng = np.random.default_rng(0)
    b = Builder()
    q, k, v = b.input("q", (b_, h, s, d)), b.input("k", (b_, h, t, d)), b.input("v", (b_, h, t, d))
    ct = b.input("ct", (b_, h, s, d))
    y = b.op("attention", q, k, v, causal=False)
    grads = gradients(b.e, b.sum(y * ct).id, [q.id, k.id, v.id])
    b.output("y", y)
    b.g.outputs.update(gq=grads[q.id], gk=grads[k.id], gv=grads[v.id])
    shapes = {"q": (b_, h, s, d), "k": (b_, h, t, d), "v": (b_, h, t, d), "ct": (b_, h, s, d)}
    return b.build(), {n: rng.standard_normal(sh).astype(np.float32) for n, sh in shapes.items()}


def _torch_attention_backward(inputs):
    import torch

    q, k, v = (torch.tensor(inputs[n], device="cuda", requires_grad=True) for n in "qkv")
    ct = torch.tensor(inputs["ct"], device="cuda")

    def step():
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return torch.autograd.grad(y, (q, k, v), ct)
    return step


def _chain_model(length):
    """`length` dependent 4x16x16 matmuls: one tiny dispatch each (the per-dispatch floor)."""
    from meganeura.compiler import Builder

    rng = np.random.default_rng(0)
    b = Builder()
    y = b.input("x", (4, 16))
    for i in range(length):
        y = b.matmul(y, b.param(f"w{i}", rng.standard_normal((16, 16)) / 4))
    b.output("y", y)
    return b.build(), {"x": rng.standard_normal((4, 16)).astype(np.float32)}


def _ours(device, model, inputs):
    from meganeura.compiler import compile_model
    from meganeura.runtime import Package, Session
    from timing import time_program

    s = Session(device, Package.from_bytes(compile_model(model)))
    r = time_program(s, "infer", inputs, iters=ITERS, warmup=min(ITERS, 10))
    return (r["gpu_ms"] or 0.0) * 1e3, r["dispatches"]


def _torch_gemm(x, params, epi):
    import torch

    f = torch.nn.functional
    x = torch.tensor(x, device="cuda")
    w = torch.tensor(params["w"], dtype=torch.float32, device="cuda")
    torch.backends.cudnn.allow_tf32 = False
    if epi == "plain":
        return lambda: x @ w
    if epi == "conv3x3":
        return lambda: f.conv2d(x, w, padding=1)
    if epi == "conv3x3_grad":
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        ct = torch.ones(x.shape[0], w.shape[0], x.shape[2], x.shape[3], device="cuda")
        return lambda: torch.autograd.grad(f.conv2d(xg, wg, padding=1), (xg, wg), ct)
    bias = torch.tensor(params["b"], dtype=torch.float32, device="cuda") if epi != "none" else None
    return (lambda: f.gelu(f.linear(x, w, bias))) if epi == "gelu" else (lambda: f.linear(x, w, bias))


def _torch_attention(inputs):
    import torch

    q, k, v = (torch.tensor(inputs[n], device="cuda") for n in "qkv")
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _torch_us(fn):
    from timing import time_torch

    return time_torch(fn, iters=ITERS, warmup=10)["gpu_ms"] * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--smoke", action="store_true", help="two small cases, three runs each (CPU rasterisers)")
    ap.add_argument("--big-only", action="store_true", help="only the GEMMs on 128-tiles; no attention")
    ap.add_argument("--attention-backward-only", action="store_true", help="only the attention backward cases")
    ap.add_argument("--conv-only", action="store_true", help="only ResNet-50's 3x3 convolutions and their gradients")
    ap.add_argument("--gemms-only", action="store_true", help="every GEMM and convolution case; no attention")
    ap.add_argument("--plans", nargs="*", help="only the plans (GEMM, attention, attention backward) whose "
                    "names contain one of these")
    args = ap.parse_args(argv)
    if args.plans:
        for plans in (GEMM_PLANS, ATTENTION_PLANS, ATTENTION_BWD_PLANS):
            for name in [n for n in plans if not any(p in n for p in args.plans)]:
                del plans[name]
        if not (GEMM_PLANS or ATTENTION_PLANS or ATTENTION_BWD_PLANS):
            ap.error(f"no plan's name contains any of {args.plans}")
    global GEMMS, ATTENTIONS, ITERS
    if args.big_only:
        from meganeura.compiler.codegen.gemm import gemm_plan

        def conv(g):
            return g[3].startswith("conv")
        GEMMS = [g for g in GEMMS if gemm_plan(g[1] if conv(g) else g[0], g[0] * g[2] ** 2 if conv(g) else g[2],
                                               g[1], 1, conv(g))[0] == 128]
        ATTENTIONS = []
        ATTENTION_BACKWARDS[:] = []
    if args.gemms_only:
        ATTENTIONS = []
        ATTENTION_BACKWARDS[:] = []
    if args.attention_backward_only:
        GEMMS, ATTENTIONS = [], []
    if args.conv_only:
        GEMMS, ATTENTIONS = [g for g in GEMMS if g[3].startswith("conv")], []
        ATTENTION_BACKWARDS[:] = []
    if args.smoke:
        ATTENTION_BACKWARDS[:] = [(1, 2, 40, 30, 8)]
        GEMMS, ATTENTIONS, ITERS = [(33, 40, 20, "gelu"), (20, 600, 30, "bias"), (1, 4, 6, "conv3x3")], [(1, 2, 40, 300, 8)], 3
    from meganeura.compiler.codegen import attention as codegen_attention, gemm as codegen_gemm
    from meganeura.runtime.device import default_device

    device = default_device()
    try:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    rows, saved_g, saved_a = [], dict(codegen_gemm.GEMM_PLAN), dict(codegen_attention.ATTENTION_PLAN)
    for m, k, n, epi in GEMMS if GEMM_PLANS else []:
        model, inputs = _gemm_model(m, k, n, epi)
        row = {"case": f"gemm {m}x{k}x{n} +{epi}", "plans": {}}
        for name, plan in GEMM_PLANS.items():
            codegen_gemm.GEMM_PLAN.update(plan)
            row["plans"][name] = _ours(device, model, inputs)
        codegen_gemm.GEMM_PLAN.update(saved_g)
        if cuda:
            row["torch_us"] = _torch_us(_torch_gemm(inputs["x"], {**model.params, **inputs}, epi))
        print(json.dumps(row), flush=True)
        rows.append(row)
    codegen_gemm.GEMM_PLAN.update(saved_g)
    for shape in ATTENTIONS if ATTENTION_PLANS else []:
        model, inputs = _attention_model(*shape)
        row = {"case": f"attention {shape}", "plans": {}}
        for name, plan in ATTENTION_PLANS.items():
            codegen_attention.ATTENTION_PLAN.update(plan)
            row["plans"][name] = _ours(device, model, inputs)
        if cuda:
            row["torch_us"] = _torch_us(_torch_attention(inputs))
        print(json.dumps(row), flush=True)
        rows.append(row)
    codegen_attention.ATTENTION_PLAN.update(saved_a)
    from meganeura.compiler.ir import ops_layers

    saved_b = dict(codegen_attention.ATTENTION_BWD_PLAN)
    saved_l = {k: getattr(ops_layers, k) for k in ("BACKWARD_BUDGET", "SCORES_IN_MEMORY_MAX", "SCORES_PARAM_SHARE")}
    for shape in ATTENTION_BACKWARDS if ATTENTION_BWD_PLANS else []:
        row = {"case": f"attention_backward {shape} (forward included)", "plans": {}}
        for name, plan in ATTENTION_BWD_PLANS.items():
            plan = dict(plan)
            budget, fused = plan.pop("budget"), plan.pop("fused")
            codegen_attention.ATTENTION_BWD_PLAN.update(plan)
            ops_layers.BACKWARD_BUDGET = budget
            # the gradient rule picks fused or decomposed as the graph is built: force it
            ops_layers.SCORES_IN_MEMORY_MAX = 0 if fused else float("inf")
            ops_layers.SCORES_PARAM_SHARE = 0 if fused else float("inf")
            model, inputs = _attention_backward_model(*shape)
            row["plans"][name] = _ours(device, model, inputs)
        codegen_attention.ATTENTION_BWD_PLAN.update(saved_b)
        for k, v in saved_l.items():
            setattr(ops_layers, k, v)
        if cuda:
            row["torch_us"] = _torch_us(_torch_attention_backward(inputs))
        print(json.dumps(row), flush=True)
        rows.append(row)
    floor = {}
    for length in (1, 64):
        us, n = _ours(device, *_chain_model(length))
        floor[length] = (us, n)
    per = (floor[64][0] - floor[1][0]) / max(1, floor[64][1] - floor[1][1])
    rows.append({"case": "dispatch floor", "us_per_dependent_dispatch": per, "one_dispatch_pass_us": floor[1][0]})
    print(json.dumps(rows[-1]), flush=True)
    totals = {}
    for r in rows:
        for name, (us, _) in r.get("plans", {}).items():
            totals.setdefault(r["case"].split()[0], {}).setdefault(name, 0.0)
            totals[r["case"].split()[0]][name] += us
    print(json.dumps({"totals_us": totals}, indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemm_policy.json").write_text(json.dumps({"rows": rows, "totals_us": totals}, indent=1))


if __name__ == "__main__":
    main()

"""GEMM and attention plans on this GPU: each transformer-sized matmul (with its bias or
GELU epilogue) and attention of the bench's models, compiled under several plans (changes to
CompileOptions' gemm, attention and attention_backward plans), GPU time by timestamps, cuBLAS /
SDPA beside them. Picks the plan with the least total time; the defaults in
compiler/codegen/plans.py come from here.

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
# each plan: the keys it changes from the defaults (CompileOptions().replace(gemm=plan)). Plans
# of switches since removed (bench/REJECTED.md) are in older result files only
GEMM_PLANS = {
    "default": {},
    "128-tiles whatever M and N": {"big_min_side": 0},
    "128-tile matmuls with K steps of 16": {"big_bk": 16},
    "one K step per loop trip": {"k_unroll": 1, "k_unroll_small": 1},
    "128-tiles: 2 K steps per loop trip, however long K": {"k_unroll_long": 2},
    "64-tiles from 128 workgroups": {"fill": 128},
}
ITERS = 100
# attention backward (dQ, dK, dV of one attention): Whisper-tiny, DINOv2, SD-1.5's first level (self, cross)
ATTENTION_BACKWARDS = [(1, 6, 1500, 1500, 64), (1, 6, 257, 257, 64), (1, 8, 4096, 4096, 40), (1, 8, 4096, 77, 40)]
# attention backward plans: changes to CompileOptions' attention_backward plan, and "budget"
# (ops_layers.BACKWARD_BUDGET) and "fused" (False: the decomposition's gradient, scores in memory,
# GEMMs, softmax); fill: workgroups the fused kernels aim for by cutting their loops into chunks
# (0: whole loops)
_BWD = {"budget": 32768, "fused": True}
ATTENTION_BWD_PLANS = {"whole loops": {**_BWD, "fill": 0}, "split to 528": {**_BWD, "fill": 528},
                       "split to 1056 (default)": _BWD,
                       "split to 1056, score columns looped": {**_BWD, "unroll_scores": 0},
                       "split to 1056, score columns written out": {**_BWD, "unroll_scores": 64},
                       "split to 2112": {**_BWD, "fill": 2112},
                       "decomposed": {**_BWD, "fill": 0, "fused": False}}
ATTENTION_PLANS = {"fill 256": {"fill": 256, "min_keys": 256},
                   "fill 1024": {"fill": 1024, "min_keys": 256},
                   "fill 1024, from 64 keys": {"fill": 1024},
                   "fill 2048, from 64 keys": {"fill": 2048},
                   "fill 512, from 64 keys (default)": {}}


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


def _ours(device, model, inputs, options=None):
    from meganeura.compiler import compile_model
    from meganeura.runtime import Package, Session
    from timing import time_program

    s = Session(device, Package.from_bytes(compile_model(model, options=options)))
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


def _select_cases(args, ap):
    """Narrow the module's plans and cases to what the flags ask for."""
    global GEMMS, ATTENTIONS, ITERS
    if args.plans:
        for plans in (GEMM_PLANS, ATTENTION_PLANS, ATTENTION_BWD_PLANS):
            for name in [n for n in plans if not any(p in n for p in args.plans)]:
                del plans[name]
        if not (GEMM_PLANS or ATTENTION_PLANS or ATTENTION_BWD_PLANS):
            ap.error(f"no plan's name contains any of {args.plans}")
    if args.big_only:
        from meganeura.compiler import CompileOptions
        from meganeura.compiler.codegen.gemm import gemm_plan

        def conv(g):
            return g[3].startswith("conv")
        GEMMS = [g for g in GEMMS if gemm_plan(CompileOptions().gemm, g[1] if conv(g) else g[0],
                                               g[0] * g[2] ** 2 if conv(g) else g[2], g[1], 1, conv(g))[0] == 128]
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


def _forward_rows(device, cuda: bool) -> list:
    """A row per GEMM and per attention case: each plan's GPU time, and PyTorch's."""
    from meganeura.compiler import CompileOptions

    rows = []
    for m, k, n, epi in GEMMS if GEMM_PLANS else []:
        model, inputs = _gemm_model(m, k, n, epi)
        row = {"case": f"gemm {m}x{k}x{n} +{epi}", "plans": {}}
        for name, plan in GEMM_PLANS.items():
            row["plans"][name] = _ours(device, model, inputs, CompileOptions().replace(gemm=plan))
        if cuda:
            row["torch_us"] = _torch_us(_torch_gemm(inputs["x"], {**model.params, **inputs}, epi))
        print(json.dumps(row), flush=True)
        rows.append(row)
    for shape in ATTENTIONS if ATTENTION_PLANS else []:
        model, inputs = _attention_model(*shape)
        row = {"case": f"attention {shape}", "plans": {}}
        for name, plan in ATTENTION_PLANS.items():
            row["plans"][name] = _ours(device, model, inputs, CompileOptions().replace(attention=plan))
        if cuda:
            row["torch_us"] = _torch_us(_torch_attention(inputs))
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def _backward_rows(device, cuda: bool) -> list:
    """A row per attention backward case: each plan's GPU time (forward included), and PyTorch's."""
    from meganeura.compiler import CompileOptions
    from meganeura.compiler.ir import ops_layers

    rows = []
    saved_l = {k: getattr(ops_layers, k) for k in ("BACKWARD_BUDGET", "SCORES_IN_MEMORY_MAX", "SCORES_PARAM_SHARE")}
    for shape in ATTENTION_BACKWARDS if ATTENTION_BWD_PLANS else []:
        row = {"case": f"attention_backward {shape} (forward included)", "plans": {}}
        for name, plan in ATTENTION_BWD_PLANS.items():
            plan = dict(plan)
            budget, fused = plan.pop("budget"), plan.pop("fused")
            ops_layers.BACKWARD_BUDGET = budget
            # the gradient rule picks fused or decomposed as the graph is built: force it
            ops_layers.SCORES_IN_MEMORY_MAX = 0 if fused else float("inf")
            ops_layers.SCORES_PARAM_SHARE = 0 if fused else float("inf")
            model, inputs = _attention_backward_model(*shape)
            row["plans"][name] = _ours(device, model, inputs, CompileOptions().replace(attention_backward=plan))
        for k, v in saved_l.items():
            setattr(ops_layers, k, v)
        if cuda:
            row["torch_us"] = _torch_us(_torch_attention_backward(inputs))
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def _dispatch_floor(device) -> dict:
    """The time a dependent dispatch costs (a chain of tiny matmuls, 1 and 64 long)."""
    floor = {}
    for length in (1, 64):
        us, n = _ours(device, *_chain_model(length))
        floor[length] = (us, n)
    per = (floor[64][0] - floor[1][0]) / max(1, floor[64][1] - floor[1][1])
    return {"case": "dispatch floor", "us_per_dependent_dispatch": per, "one_dispatch_pass_us": floor[1][0]}


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
    _select_cases(args, ap)
    from meganeura.runtime.device import default_device

    device = default_device()
    try:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    rows = _forward_rows(device, cuda) + _backward_rows(device, cuda)
    rows.append(_dispatch_floor(device))
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

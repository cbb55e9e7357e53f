"""Attention's fused backward (compiler/codegen/templates/attention_dq.wgsl, attention_dkv.wgsl): dQ, dK and dV
on the GPU against torch CPU autograd in float64, full tensors, for causal and full attention,
grouped-query heads, odd token counts, head dims from 4 to 160 and batches above one; with
head transposes read and written in place; and the training graph of a transformer, which
must hold no [tokens x tokens] tensor any more."""
import math

import numpy as np
import pytest
import torch
from meganeura.compiler import Builder, CompileOptions, compile_graph, compile_model
from meganeura.compiler.codegen.kernels import generate
from meganeura.compiler.ir import ops_layers
from meganeura.compiler.ir.autodiff import gradients
from meganeura.compiler.passes.prepare import prepare
from meganeura.compiler.passes.schedule import schedule
from meganeura.runtime import Package, Session

TOL = 1e-4


@pytest.fixture(autouse=True)
def fused_at_every_size(monkeypatch):
    """These tests are about the fused kernels: small attentions take them too (by default they
    differentiate the decomposition, ops_layers.SCORES_IN_MEMORY_MAX)."""
    monkeypatch.setattr(ops_layers, "SCORES_IN_MEMORY_MAX", 0)
    monkeypatch.setattr(ops_layers, "SCORES_PARAM_SHARE", 0)

# name: q shape, k (and v) shape, attributes
CASES = {
    "full-b2-7-d8": ((2, 4, 7, 8), (2, 4, 7, 8), {}),
    "causal-gqa-b2-13-d16": ((2, 4, 13, 16), (2, 2, 13, 16), {"causal": True}),
    "causal-more-keys-scale-b2-13x20": ((2, 3, 13, 16), (2, 3, 20, 16), {"causal": True, "scale": 0.3}),
    "causal-gqa3-257-d64": ((1, 6, 257, 64), (1, 2, 257, 64), {"causal": True}),  # split forward, small blocks
    "full-b3-257-d64": ((3, 6, 257, 64), (3, 6, 257, 64), {}),  # large blocks, 16 x 16 threads
    "full-b2-9x11-d40": ((2, 3, 9, 40), (2, 3, 11, 40), {}),  # ten vec4 columns over eight threads
    "causal-gqa-13-d160": ((1, 2, 13, 160), (1, 1, 13, 160), {"causal": True}),  # the smallest blocks
    "causal-gqa-20x700-d8": ((1, 2, 20, 8), (1, 1, 700, 8), {"causal": True}),  # many key blocks
    "causal-5x9-d4": ((1, 2, 5, 4), (1, 2, 9, 4), {"causal": True}),
}


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def _torch_attention(q, k, v, causal=False, scale=None):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:  # query i sees keys up to i + (t - s)
        sq, tk = q.shape[2], k.shape[2]
        s = s.masked_fill(~(torch.arange(tk)[None, :] <= torch.arange(sq)[:, None] + (tk - sq)), -math.inf)
    return torch.softmax(s, -1) @ v


def _labels(pkg):
    return [pkg.manifest["kernels"][d["kernel"]]["label"] for d in pkg.programs["infer"]["dispatches"]]


def _run(device, qs, ks, at, wrt="qkv", seed=0, options=None):
    """Forward and the gradients w.r.t. `wrt` of sum(attention * ct): (ours, torch's, labels)."""
    rng = np.random.default_rng(seed)
    b = Builder()
    ins = {"q": b.input("q", qs), "k": b.input("k", ks), "v": b.input("v", ks)}
    o = b.attention(ins["q"], ins["k"], ins["v"], **at)
    ct = b.input("ct", o.shape)
    grads = gradients(b.e, b.sum(o * ct).id, [ins[n].id for n in wrt])
    b.output("o", o)
    for n in wrt:
        b.g.outputs["g" + n] = grads[ins[n].id]
    vals = {"q": rng.standard_normal(qs), "k": rng.standard_normal(ks), "v": rng.standard_normal(ks),
            "ct": rng.standard_normal(o.shape)}
    vals = {n: x.astype(np.float32).astype(np.float64) for n, x in vals.items()}
    pkg = Package.from_bytes(compile_graph(b.g, options=options))
    got = Session(device, pkg).run("infer", vals)
    t = {n: torch.tensor(vals[n], requires_grad=n in wrt) for n in "qkv"}
    to = _torch_attention(t["q"], t["k"], t["v"], **at)
    tg = torch.autograd.grad((to * torch.tensor(vals["ct"])).sum(), [t[n] for n in wrt])
    ref = {"o": to.detach().numpy(), **{"g" + n: g.numpy() for n, g in zip(wrt, tg)}}
    return got, ref, _labels(pkg)


def _split_loops(split: bool) -> CompileOptions:
    """Options cutting the backward kernels' loops into chunks of one block each (partial sums,
    then a sum pass), as codegen/attention.py does for long sequences over few workgroups; or
    not at all."""
    chunks = {"fill": 1 << 20, "min_blocks": 1, "max_chunks": 3} if split else {"fill": 0}
    return CompileOptions().replace(attention_backward=chunks)


@pytest.mark.parametrize("split", [False, True], ids=["whole_loops", "split_loops"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_backward_matches_torch(name, split, device):
    """The fused kernels with their loops whole or cut into chunks."""
    qs, ks, at = CASES[name]
    got, ref, labels = _run(device, qs, ks, at, options=_split_loops(split))
    assert any(lab.startswith("attention_dq") for lab in labels) and any(lab.startswith("attention_dkv")
                                                                          for lab in labels), labels
    if split and name in ("causal-gqa-20x700-d8", "full-b3-257-d64", "causal-gqa3-257-d64"):  # several blocks
        assert "attention_dq/sum" in labels and ("attention_dkv/sum" in labels or qs[2] <= 32), labels
    assert not any(lab.startswith(("softmax", "matmul")) for lab in labels), labels
    errors = {k: rel(got[k], r) for k, r in ref.items()}
    assert max(errors.values()) <= TOL, errors


def _kernels(qs, ks, at, options=None) -> dict:
    """Label -> WGSL of the kernels of an attention's forward and gradients (compile only)."""
    b = Builder()
    ins = {"q": b.input("q", qs), "k": b.input("k", ks), "v": b.input("v", ks)}
    o = b.attention(ins["q"], ins["k"], ins["v"], **at)
    grads = gradients(b.e, b.sum(o * b.input("ct", o.shape)).id, [ins[n].id for n in "qkv"])
    for n in "qkv":
        b.g.outputs["g" + n] = grads[ins[n].id]
    return {k["label"]: k["wgsl"] for k in Package.from_bytes(compile_graph(b.g, options=options)).manifest["kernels"]}


def test_head_dims_past_the_tiles_fall_back_to_the_decomposition(device):
    """d = 256: no block size fits 32 KiB of workgroup memory; the decomposition's gradient runs."""
    got, ref, labels = _run(device, (1, 2, 13, 256), (1, 2, 13, 256), {})
    assert "attention_dq" not in labels and "softmax" in labels, labels
    errors = {k: rel(got[k], r) for k, r in ref.items()}
    assert max(errors.values()) <= TOL, errors


@pytest.mark.parametrize("wrt", ["q", "kv"])
def test_only_some_gradients(wrt, device):
    """Only dQ: no key-side kernel. Only dK, dV: the query-side kernel computes D alone."""
    got, ref, labels = _run(device, (2, 4, 13, 8), (2, 2, 17, 8), {"causal": True}, wrt=wrt)
    assert ("attention_dkv" in labels) == (wrt == "kv"), labels
    errors = {k: rel(got[k], r) for k, r in ref.items()}
    assert max(errors.values()) <= TOL, errors


@pytest.mark.parametrize("split", [False, True], ids=["whole_loops", "split_loops"])
@pytest.mark.parametrize("causal", [False, True])
def test_head_transposes_are_read_and_written_in_place(causal, split, device):
    """q, k, v built as [b, t, h, d] and transposed (as every transformer builds them), the output
    transposed back: the backward reads dO and writes dQ, dK, dV through those transposes, the
    forward writes its output through one; no transpose kernel is left. Weight gradients vs torch."""
    options = _split_loops(split)
    rng = np.random.default_rng(3)
    bsz, t, hq, hk, d = 2, 40 if split else 11, 4, 2, 8  # (40: two blocks of keys and of queries)
    b = Builder()
    x = b.input("x", (bsz, t, 24))
    ws = {n: rng.standard_normal((h * d, 24)) * 0.3 for n, h in (("q", hq), ("k", hk), ("v", hk))}
    heads = [b.transpose(b.reshape(b.linear(x, b.param(f"{n}.weight", ws[n])), (bsz, t, h, d)), (0, 2, 1, 3))
             for n, h in (("q", hq), ("k", hk), ("v", hk))]
    o = b.attention(*heads, causal=causal)
    y = b.reshape(b.transpose(o, (0, 2, 1, 3)), (bsz, t, hq * d))
    y = b.linear(y, b.param("o.weight", rng.standard_normal((24, hq * d)) * 0.3))
    ct = b.input("ct", y.shape)
    params = {n: b.g.params[f"{n}.weight"] for n in "qkvo"}
    grads = gradients(b.e, b.sum(y * ct).id, list(params.values()) + [x.id])
    b.output("y", y)
    b.g.outputs.update({f"g{n}": grads[i] for n, i in params.items()}, gx=grads[x.id])
    pkg = Package.from_bytes(compile_graph(b.g, options=options))
    labels = _labels(pkg)
    assert not any("transpose" in lab for lab in labels), labels
    split = "/split" * split
    assert labels.count("attention_dq" + split) == labels.count("attention_dkv" + split) == 1, labels
    vals = {"x": rng.standard_normal((bsz, t, 24)), "ct": rng.standard_normal(y.shape)}
    got = Session(device, pkg).run("infer", vals)
    tw = {n: torch.tensor(np.asarray(b.g.values[f"{n}.weight"], np.float64), requires_grad=True) for n in "qkvo"}
    tx = torch.tensor(vals["x"], requires_grad=True)
    th = [torch.nn.functional.linear(tx, tw[n]).view(bsz, t, h, d).transpose(1, 2)
          for n, h in (("q", hq), ("k", hk), ("v", hk))]
    ty = torch.nn.functional.linear(_torch_attention(*th, causal=causal).transpose(1, 2).reshape(bsz, t, hq * d),
                                    tw["o"])
    (ty * torch.tensor(vals["ct"])).sum().backward()
    ref = {"y": ty.detach().numpy(), "gx": tx.grad.numpy(), **{f"g{n}": tw[n].grad.numpy() for n in "qkvo"}}
    errors = {k: rel(got[k], r) for k, r in ref.items()}
    assert max(errors.values()) <= TOL, errors


def _train_program(layers, monkeypatch=None):
    """A DINOv2-small-like training step (257 tokens, 6 heads of 64): its dispatch labels, and how
    many of its kernels write a [257 x 257] tensor."""
    from meganeura.compiler.ir.training import TrainConfig, build_training_graph
    from meganeura.compiler.models.dinov2 import Dinov2Config, dinov2

    cfg = Dinov2Config(hidden_size=384, num_hidden_layers=layers, num_attention_heads=6, image_size=518, patch_size=14)
    g = prepare(build_training_graph(dinov2(cfg, batch=1, height=224, width=224).graph,
                                     TrainConfig(loss="mse", optimizer="adamw", lr=1e-4)))
    sched = schedule(g)
    labels, square = [], 0
    for k in sched.kernels:
        code = generate(sched, k)
        labels += [c.label for c in (code if isinstance(code, list) else [code])]
        square += any(g.nodes[r].shape[-2:] == (257, 257) for r in k.roots)
    return labels, square


def test_training_graph_has_no_token_by_token_tensors(monkeypatch):
    """Per layer, attention costs 2 forward dispatches (kernel and key-split merge) and 4 backward
    ones (dQ and dK/dV, their loops cut in chunks, and the sums of their chunks); the
    decomposition's gradient (still the fallback) cost 10 more, 4 of them [257 x 257]."""
    fused = {n: _train_program(n) for n in (1, 2)}
    for n, (labels, square) in fused.items():
        assert square == 0
        assert labels.count("attention_dq/split") == labels.count("attention_dkv/split") == n, labels
        assert labels.count("attention_dq/sum") == labels.count("attention_dkv/sum") == n, labels
        assert not any(lab.startswith("softmax") for lab in labels), labels
    per_layer = len(fused[2][0]) - len(fused[1][0])
    monkeypatch.setattr(ops_layers, "backward_blocks", lambda d, budget=0: None)
    old = {n: _train_program(n) for n in (1, 2)}
    assert old[2][1] - old[1][1] == 4  # scores, probabilities, dP, dS
    assert len(old[2][0]) - len(old[1][0]) - per_layer >= 10


def test_compiled_training_package_runs_a_step(device):
    """compile_model's train_step with the fused backward: one AdamW step on a tiny DINOv2 lowers
    the loss (the whole program, weights updated in place, on the GPU)."""
    from meganeura.compiler.ir.training import TrainConfig
    from meganeura.compiler.models.dinov2 import Dinov2Config, dinov2

    cfg = Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, image_size=28, patch_size=14)
    pkg = Package.from_bytes(compile_model(dinov2(cfg, batch=2, height=28, width=42),
                                           TrainConfig(loss="mse", optimizer="adamw", lr=1e-2)))
    labels = [pkg.manifest["kernels"][d["kernel"]]["label"] for d in pkg.programs["train_step"]["dispatches"]]
    assert "attention_dq" in labels and "attention_dkv" in labels, labels
    s = Session(device, pkg)
    rng = np.random.default_rng(0)
    feed = {"pixel_values": rng.standard_normal((2, 3, 28, 42)), "labels": rng.standard_normal((2, 7, 32))}
    losses = [float(s.run("train_step", feed)["loss"]) for _ in range(3)]
    assert losses[2] < losses[0], losses


def test_small_attentions_keep_their_scores_in_memory(device, monkeypatch):
    """By default an attention whose scores fit SCORES_IN_MEMORY_MAX differentiates the
    decomposition (GEMMs and a softmax: faster on the H200); a larger one takes the fused
    kernels. Both against torch where they run here."""
    monkeypatch.setattr(ops_layers, "SCORES_IN_MEMORY_MAX", 16 << 20)
    monkeypatch.setattr(ops_layers, "SCORES_PARAM_SHARE", 0.25)
    got, ref, labels = _run(device, (2, 3, 13, 16), (2, 3, 20, 16), {"causal": True, "scale": 0.3})
    assert "attention_dq" not in labels and "softmax" in labels, labels
    errors = {k: rel(got[k], r) for k, r in ref.items()}
    assert max(errors.values()) <= TOL, errors

    def ops_of(q_shape, weights=0):  # the gradient graph of a larger attention, not run
        b = Builder()
        q = b.input("q", q_shape)
        if weights:  # the parameters of a model around it (not read here)
            b.param("w", np.zeros(weights // 4, np.float32))
        grads = gradients(b.e, b.sum(b.attention(q, q, q)).id, [q.id])
        return {b.g.nodes[i].op for i in range(grads[q.id] + 1)}
    assert "attention_grad" in ops_of((1, 6, 1500, 64))  # 54 MB of scores
    assert "attention_grad" not in ops_of((1, 6, 257, 64))  # 1.6 MB
    assert "attention_grad" in ops_of((1, 6, 1500, 64), 200 << 20)  # over a quarter of 200 MB of weights
    assert "attention_grad" not in ops_of((1, 6, 1500, 64), 240 << 20)  # under a quarter of 240 MB


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_kernel_declares_workgroup_memory_the_runtime_can_size(name):
    """The runtime checks each kernel's workgroup memory against the device (wgpu 0.32 does
    not): every kernel the compiler emits, GPU and CPU variants, must be sized, within the
    fused gradients' 32 KiB budget, and the forward's 256 bytes per head-dim column."""
    from meganeura.runtime.package import workgroup_bytes

    qs, ks, at = CASES[name]
    b = Builder()
    ins = {"q": b.input("q", qs), "k": b.input("k", ks), "v": b.input("v", ks)}
    o = b.attention(ins["q"], ins["k"], ins["v"], **at)
    grads = gradients(b.e, b.sum(o * b.input("ct", o.shape)).id, [ins[n].id for n in "qkv"])
    b.output("o", o)
    b.g.outputs.update({f"g{n}": grads[ins[n].id] for n in "qkv"})
    kernels = Package.from_bytes(compile_graph(b.g)).manifest["kernels"]
    sizes = {k["label"]: workgroup_bytes(k["wgsl"]) for k in kernels}
    assert None not in sizes.values(), sizes
    assert all(v <= 32768 for lab, v in sizes.items() if lab.startswith(("attention_dq", "attention_dkv"))), sizes
    assert all(v <= 256 * qs[-1] + 1024 for lab, v in sizes.items() if lab == "attention"), sizes
    # the backward's tiles are [row][column]: wgpu's bounds checks clamp a row once per loop step
    backward = [k["wgsl"] for k in kernels if k["label"].startswith(("attention_dq", "attention_dkv"))
                and "/sum" not in k["label"]]
    assert backward and all("var<workgroup> k_t: array<array<vec4<f32>, " in w for w in backward)


@pytest.mark.parametrize("unroll_scores", [4, 0, 16])
@pytest.mark.parametrize("name", ["full-b3-257-d64", "full-b2-9x11-d40"])
def test_score_columns_written_out_or_looped(name, unroll_scores, device):
    """The attention_backward plan's unroll_scores: the score tile's column loop is written out,
    a block per step, where a thread's share of the tile is at most that many scores (d = 64's
    16 x 16 threads hold 2, d = 40's 8 x 8 hold 8), else kept as a loop; the dQ steps (jj)
    and the dK, dV steps (ii) are always written out. The same answers either way."""
    qs, ks, at = CASES[name]
    options = CompileOptions().replace(attention_backward={"unroll_scores": unroll_scores})
    kernels = {lab: w for lab, w in _kernels(qs, ks, at, options).items() if "/sum" not in lab}
    dq = [w for lab, w in kernels.items() if lab.startswith("attention_dq")]
    dkv = [w for lab, w in kernels.items() if lab.startswith("attention_dkv")]
    share = 2 if name.endswith("d64") else 8
    assert dq and dkv and all(("let c = 0u;" in w) == (share <= unroll_scores) for w in dq + dkv)
    assert all((f"for (var c = 0u; c < {qs[-1] // 4}u;" in w) == (share > unroll_scores) for w in dq + dkv)
    assert all("let jj = 0u;" in w and "let ii = 0u;" not in w for w in dq)
    assert all("let ii = 0u;" in w and "let jj = 0u;" not in w for w in dkv)
    got, ref, _ = _run(device, qs, ks, at, options=options)
    errors = {k: rel(got[k], r) for k, r in ref.items()}
    assert max(errors.values()) <= TOL, errors

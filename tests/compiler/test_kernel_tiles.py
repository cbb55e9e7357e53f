"""Workgroup-tile layouts of the GEMM and attention kernels: each against numpy / torch in a
Session with wgpu's default checks, whose index clamps the GEMM's 2D tiles exist to move out
of inner loops."""
from __future__ import annotations

import numpy as np
import pytest
from kernel_cases import assert_close, conv_with_gradients, matmul_case
from meganeura.compiler import Builder, compile_model
from meganeura.runtime import Package, Session


@pytest.mark.parametrize("case", ["128_k_and_groups", "128_transposed_vec4", "64_split_k", "32_split_k", "conv_grads",
                                  "128_x_wT", "64_x_wT", "64_group_loads"])
def test_tiles_indexed_by_k_then_group(case, device):
    """GEMM workgroup tiles declared [k][group] (wgpu's bounds checks then clamp the group, the
    same every K step): matmuls on every tile size, ragged edges, split-K, operands staged 4 k
    at a time and 16 bytes a tile entry, and a convolution with both gradients, against numpy /
    torch, in a Session with its default checks."""
    if case == "conv_grads":
        model, vals, refs = conv_with_gradients((2, 16, 10, 10), (70, 16, 3, 3), 1, seed=10, w_scale=0.2)
    else:
        sa, sb, ta, tb = {"128_k_and_groups": ((2050, 40), (40, 2049), False, False),
                          "128_transposed_vec4": ((20, 2048), (20, 2052), True, False),
                          "64_split_k": ((300, 700), (700, 130), False, False),
                          "32_split_k": ((33, 300), (300, 70), False, False),
                          # x @ w^T: B read 4 k at a time; and 16-byte group loads on small tiles
                          "128_x_wT": ((2050, 64), (2049, 64), False, True),
                          "64_x_wT": ((300, 700), (132, 700), False, True),
                          "64_group_loads": ((300, 700), (700, 132), False, False)}[case]
        model, vals, refs = matmul_case(sa, sb, ta, tb, seed=10)
    pkg = Package.from_bytes(compile_model(model))
    gpu = [k["wgsl"] for k in pkg.manifest["kernels"] if "var<workgroup> a_tile" in k["wgsl"]]
    assert gpu and all("var<workgroup> a_tile: array<array<" in k for k in gpu)
    marker = {"128_x_wT": "b_tile[bq0][0u][(br0 / 4u) / 16u][(br0 / 4u) % 16u][br0 % 4u] = pb0.x;",
              "64_x_wT": "b_tile[qb * 4u + 0u][rb / 4u][rb % 4u] = vb.x;",
              "64_group_loads": "b_tile[bk][bg] = load_b4"}.get(case)
    assert marker is None or any(marker in k for k in gpu), case
    if case.startswith("128"):
        assert any("acc0l" in k for k in gpu)
    assert_close(Session(device, pkg, device_class="gpu").run("infer", vals), refs)


@pytest.mark.parametrize("case", ["grouped_causal", "split_keys", "wide_heads"])
def test_attention_tiles_indexed_by_key_times_width(case, device):
    """The forward kernel's key and value tiles declared flat, key * DV4 + vec4 (2D tiles were
    slower here: bench/REJECTED.md): grouped-query heads with a causal mask, keys split across
    workgroups, 160-wide heads (25 keys a tile), against torch, in a Session with its default
    checks."""
    import torch
    from meganeura.runtime.package import workgroup_bytes

    shapes, causal, rep = {"grouped_causal": ({"q": (2, 4, 70, 16), "k": (2, 2, 75, 16), "v": (2, 2, 75, 16)}, True, 2),
                           "split_keys": ({"q": (1, 2, 20, 32), "k": (1, 2, 300, 32), "v": (1, 2, 300, 32)}, False, 1),
                           "wide_heads": ({"q": (1, 2, 70, 160), "k": (1, 2, 60, 160), "v": (1, 2, 60, 160)}, False, 1)}[case]
    rng = np.random.default_rng(12)
    b = Builder()
    ins = {n: b.input(n, sh) for n, sh in shapes.items()}
    b.output("o", b.attention(ins["q"], ins["k"], ins["v"], causal=causal))
    pkg = Package.from_bytes(compile_model(b.build()))
    fwd = next(k["wgsl"] for k in pkg.manifest["kernels"] if k["label"] == "attention")
    assert "var<workgroup> k_tile: array<vec4<f32>, " in fwd and "k_tile[jj * " in fwd
    if case == "wide_heads":
        assert workgroup_bytes(fwd) == 32000
    if case == "split_keys":
        assert any(k["label"] == "attention/merge" for k in pkg.manifest["kernels"])
    vals = {n: rng.standard_normal(sh) for n, sh in shapes.items()}
    got = Session(device, pkg, device_class="gpu").run("infer", vals)["o"]
    s_, t_ = shapes["q"][2], shapes["k"][2]
    mask = torch.ones(s_, t_, dtype=torch.bool).tril(diagonal=t_ - s_) if causal else None
    tk, tv = (torch.tensor(vals[n]).repeat_interleave(rep, 1) for n in "kv")
    ref = torch.nn.functional.scaled_dot_product_attention(torch.tensor(vals["q"]), tk, tv, attn_mask=mask).numpy()
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5

"""Kernel variants per device class: the package carries GPU kernels and CPU-rasteriser
kernels; both give the same answers. CI has only lavapipe, so the GPU variants are run
here by asking for them explicitly."""
import numpy as np
import pytest
from kernel_cases import assert_close, conv_with_gradients, matmul_case, session
from meganeura.compiler import Builder, CompileOptions, compile_model
from meganeura.runtime import Package, Session

CASES = {  # (a shape, b shape, trans_a, trans_b): edges, batches, split-K, the dot-product path
    "linear_k_multiple_of_4": ((3, 37, 64), (50, 64), False, True),
    "linear_split_k": ((70, 3000), (50, 3000), False, True),
    "large_tiles": ((520, 96), (96, 530), False, False),
    "batched_broadcast": ((2, 3, 33, 20), (3, 20, 17), False, False),
    "transposed_a": ((40, 70), (40, 9), True, False),
    "tiles_of_64": ((1040, 40), (40, 1040), False, False),
    "tiles_of_64_k_contiguous": ((1040, 41), (1030, 41), False, True),
    "tiles_of_128_k_contiguous": ((2050, 12), (2049, 12), False, True),
    "tiles_of_128_transposed": ((12, 2050), (12, 2049), True, False),
    "small_tiles_vec4_rows": ((48, 36), (48, 20), True, False),  # 16-byte loads along M and N
    "tiles_of_128_vec4_rows": ((12, 2048), (12, 2052), True, False),  # 16-byte loads along M and N
    "tiles_of_128_vec4_k_batched": ((3, 2048, 8), (8, 1024), False, False),  # along K (A), N (B)
    "tiles_of_32_split_k": ((33, 300), (300, 70), False, False),
}


def test_gemm_plans_by_shape():
    from meganeura.compiler.codegen.gemm import gemm_plan

    plan = CompileOptions().gemm
    assert gemm_plan(plan, 4096, 4096, 4096, 1) == (128, 8, 1)
    assert gemm_plan(plan, 1040, 1040, 40, 1) == (64, 16, 1)
    assert gemm_plan(plan, 720, 720, 40, 1) == (32, 16, 1)
    assert gemm_plan(plan, 257, 384, 384, 1) == (32, 16, 3)  # 64-tiles: 30 workgroups on 132 SMs
    assert gemm_plan(plan, 33, 70, 1100, 1) == (64, 16, 17)  # a long K: split instead
    assert gemm_plan(plan, 4096, 4096, 4096, 1, conv=True) == (128, 8, 1)
    # the plan is the options': another fill moves the line between 64- and 32-tiles
    assert gemm_plan(CompileOptions().replace(gemm={"fill": 128}).gemm, 720, 720, 40, 1) == (64, 16, 1)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("device_class", ["cpu", "gpu", "quick"])
def test_matmul_variants(name, device_class, device):
    sa, sb, ta, tb = CASES[name]
    rng = np.random.default_rng(1)
    b = Builder()
    a_in, b_in = b.input("a", sa), b.input("b", sb)
    b.output("c", b.matmul(a_in, b_in, trans_a=ta, trans_b=tb))
    pkg = Package.from_bytes(compile_model(b.build()))
    s = session(device, pkg, device_class)
    A, B = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    ref = np.matmul(np.swapaxes(A, -1, -2) if ta else A.astype(np.float64), np.swapaxes(B, -1, -2) if tb else B)
    got = s.run("infer", {"a": A, "b": B})["c"]
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5
    labels = [pkg.manifest["kernels"][d.get("variants", {}).get(device_class, d)["kernel"]]["label"]
              for d in pkg.programs["infer"]["dispatches"]]
    tags = {"gpu": (), "cpu": ("(cpu)",), "quick": ("(quick)",)}[device_class]
    assert any(all(t in lab for t in tags) and not any(t in lab for t in {"(cpu)", "(quick)"} - set(tags))
               for lab in labels if lab.startswith("matmul"))


@pytest.mark.parametrize("device_class", ["cpu", "gpu", "quick"])
def test_conv_gradients_on_both_variants(device_class, device):
    model, vals, refs = conv_with_gradients((2, 3, 30, 30), (8, 3, 3, 3), 2, seed=2)
    assert_close(session(device, Package.from_bytes(compile_model(model)), device_class).run(
        "infer", vals), refs)


@pytest.mark.parametrize("tiles", ["128", "64", "32"])
def test_k_contiguous_staging_order(tiles, device):
    """Operands read 4 k at a time are staged 16 k of 8 rows per warp (64 contiguous bytes a
    row): x @ w^T (both operands K-contiguous) with ragged edges on 128-, 64- and 32-tiles,
    against numpy."""
    sa, sb = {"128": ((2050, 36), (2049, 36)), "64": ((1040, 36), (1030, 36)), "32": ((100, 36), (70, 36))}[tiles]
    model, vals, refs = matmul_case(sa, sb, tb=True, seed=9)
    pkg = Package.from_bytes(compile_model(model))
    main = [k["wgsl"] for k in pkg.manifest["kernels"] if "fn load_a4(" in k["wgsl"] and "fn load_b4(" in k["wgsl"]]
    assert main and ("acc0l" in main[0]) == (tiles == "128")
    assert ("let aq0 = (tid + 0u) % 2u;" if tiles == "128" else "let qa = e % 4u;") in main[0]
    assert_close(Session(device, pkg, device_class="gpu").run("infer", vals), refs)


def _consts(wgsl):
    import re

    return {k: int(v) for k, v in re.findall(r"const (\w+): u32 = (\d+)u;", wgsl)}


def _guards(wgsl, fn):
    """The condition of function `fn`'s edge check ('' when it has none)."""
    import re

    body = wgsl[wgsl.index(f"fn {fn}("):]
    body = body[:body.index("\n}")]
    m = re.search(r"if \(([^)]*)\) \{\n\s*return", body)
    return m.group(1) if m else ""


@pytest.mark.parametrize("plan", ["default", "big_bk_16"])
def test_edge_guards_match_the_tiles(plan):
    """Compile only: in every GPU GEMM kernel of many shapes (ragged in M only, N only, K only,
    whole; batched, transposed, split-K; convolutions with both gradients), each of load_a,
    load_b, load_a4 / load_b4 and store checks exactly the dimensions its tile (or K step) does
    not divide, read back from the kernel's own constants; also with 128-tiles' K step of 16."""
    import re

    options = CompileOptions().replace(gemm={"big_bk": 16} if plan == "big_bk_16" else {})
    models = [matmul_case(sa, sb, ta, tb)[0] for sa, sb, ta, tb in [
        ((2050, 16), (16, 2048), False, False), ((2048, 16), (16, 2050), False, False),
        ((2048, 24), (24, 2048), False, False), ((2048, 20), (20, 2048), False, False),
        ((2048, 36), (2049, 36), False, True), ((3, 2048, 8), (8, 1024), False, False),
        ((300, 700), (700, 130), False, False), ((1040, 40), (40, 1040), False, False),
        ((128, 1024), (1024, 128), False, False), ((33, 300), (300, 70), False, False),
        ((40, 70), (40, 9), True, False)]]
    models += [conv_with_gradients(xs, ws, 1, seed=11)[0] for xs, ws in [
        ((2, 16, 8, 8), (64, 16, 3, 3)), ((2, 3, 30, 30), (8, 3, 3, 3)), ((2, 4, 128, 128), (128, 4, 3, 3))]]
    seen = set()
    for model in models:
        for k in Package.from_bytes(compile_model(model, options=options)).manifest["kernels"]:
            w = k["wgsl"]
            if "fn load_a(" not in w or k["label"].endswith(("(cpu)", "(quick)")):  # (all guarded)
                continue
            c = _consts(w)
            tile = int(re.search(r"let row0 = wg\.y \* (\d+)u;", w).group(1)) if "acc0l" in w else 4 * c["TG"]
            bk = c.get("BK", 16)
            assert c["KS"] % bk == 0, k["label"]
            ragged = {"m": c["M"] % tile != 0, "n": c["N"] % tile != 0, "k": c["K"] % bk != 0}
            for fn, dims in (("load_a", "mk"), ("load_b", "kn"), ("load_a4", "mk"), ("load_b4", "kn"), ("store", "mn")):
                if f"fn {fn}(" not in w:
                    continue
                cond = _guards(w, fn)
                for d in dims:
                    assert (f"{d} >= {d.upper()}" in cond) == ragged[d], (k["label"], fn, d, c, tile, cond)
            seen.add((tile == 128 or "acc0l" in w, ragged["m"], ragged["n"], ragged["k"]))
    # both kernel families, and each dimension ragged alone as well as none
    assert {big for big, *_ in seen} == {True, False}
    assert {(True, False, False), (False, True, False), (False, False, True), (False, False, False)} <= \
        {tuple(r) for _, *r in seen}, seen


@pytest.mark.parametrize("case", ["128_tiles", "64_tiles_split_k", "128_tiles_ragged_k", "conv_grads"])
def test_whole_tiles_go_unguarded(case, device):
    """Dimensions the GPU kernels' tiles and K steps divide are read and written without edge
    checks (codegen/gemm.py, edge_guards; a ragged one keeps its check, the CPU variant all of
    them): the answers against numpy / torch, and which checks each kernel kept."""
    if case == "conv_grads":  # the forward: M 64, N 2 x 8 x 8, K 16 x 9 on 32-tiles, whole (its gradients' are not)
        model, vals, refs = conv_with_gradients((2, 16, 8, 8), (64, 16, 3, 3), 1, seed=8, w_scale=0.2)
    else:
        sa, sb = {"128_tiles": ((2048, 16), (16, 2048)), "64_tiles_split_k": ((128, 1024), (1024, 128)),
                  "128_tiles_ragged_k": ((2048, 20), (20, 2048))}[case]
        model, vals, refs = matmul_case(sa, sb, seed=8)
    pkg = Package.from_bytes(compile_model(model))
    gemms = [k for k in pkg.manifest["kernels"] if "fn load_a(" in k["wgsl"]]
    cpu = [k for k in gemms if k["label"].endswith("(cpu)")]
    assert cpu and all("if (m >= M || k >= K)" in k["wgsl"] for k in cpu)
    main = next(k for k in gemms if k not in cpu)["wgsl"]
    if case == "128_tiles_ragged_k":
        assert "acc0l" in main and "if (k >= K)" in main and "m >= M" not in main and "n >= N" not in main
    else:
        assert "m >= M" not in main and "k >= K" not in main and "n >= N" not in main, main[:3000]
        assert ("acc0l" in main) == (case == "128_tiles")
    assert_close(Session(device, pkg, device_class="gpu").run("infer", vals), refs)


@pytest.mark.parametrize("case", ["split_k_32_tiles", "conv_grads"])
def test_small_tiles_stage_without_a_loop(case, device):
    """64- and 32-tiles stage a thread's tile entries without a loop, each entry a block with
    e a constant offset from tid (32-tiles: two entries per thread). A matmul with split-K and
    a convolution with both gradients, on the GPU kernels against numpy / torch."""
    if case == "conv_grads":
        model, vals, refs = conv_with_gradients((2, 16, 10, 10), (70, 16, 3, 3), 1, seed=6, w_scale=0.2)
    else:
        model, vals, refs = matmul_case((33, 300), (300, 70), seed=6)
    pkg = Package.from_bytes(compile_model(model))
    assert any("let e = tid + 0u;" in k["wgsl"] for k in pkg.manifest["kernels"])
    assert not any("for (var e = tid;" in k["wgsl"] for k in pkg.manifest["kernels"])
    if case != "conv_grads":
        assert any("let e = tid + 64u;" in k["wgsl"] for k in pkg.manifest["kernels"])  # 32-tiles: 2 entries
    assert_close(Session(device, pkg, device_class="gpu").run("infer", vals), refs)


@pytest.mark.parametrize("k", [48, 3000, 45])  # plain, split-K (sum kernel runs the epilogue), odd K
@pytest.mark.parametrize("device_class", ["cpu", "gpu", "quick"])
def test_matmul_epilogues(k, device_class, device):
    """Bias, GELU and a residual computed in the matmul's store: same numbers as unfused."""
    from meganeura.compiler import run_graph
    from meganeura.compiler.passes.prepare import prepare
    from meganeura.compiler.passes.schedule import schedule

    rng = np.random.default_rng(k)
    b = Builder()
    x, res = b.input("x", (37, k)), b.input("res", (37, 50))
    w, bias = b.param("w", rng.standard_normal((50, k)) / np.sqrt(k)), b.param("bias", rng.standard_normal(50))
    y = b.gelu(b.linear(x, w, bias)) * 0.5 + res
    b.output("y", y)
    model = b.build()
    fused = [kk for kk in schedule(prepare(model.graph)).kernels if kk.epilogue]
    assert len(fused) == 1 and len(fused[0].epilogue) >= 4
    vals = {"x": rng.standard_normal((37, k)), "res": rng.standard_normal((37, 50))}
    got = session(device, Package.from_bytes(compile_model(model)), device_class).run("infer", vals)["y"]
    ref = run_graph(model.graph, vals)[0]["y"]
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("device_class", ["cpu", "gpu", "quick"])
def test_fused_attention_both_variants(causal, device_class, device):
    """The fused kernel (workgroup-staged tiles on GPUs, direct reads on CPU rasterisers)
    against torch: more than one tile of keys and of queries, grouped-query heads."""
    import torch
    from meganeura.compiler.passes.prepare import prepare
    from meganeura.compiler.passes.schedule import schedule

    rng = np.random.default_rng(7)
    b = Builder()
    q, k, v = b.input("q", (2, 4, 70, 16)), b.input("k", (2, 2, 75, 16)), b.input("v", (2, 2, 75, 16))
    b.output("o", b.attention(q, k, v, causal=causal))
    model = b.build()
    assert [kk.kind for kk in schedule(prepare(model.graph)).kernels] == ["attention"]
    vals = {n: rng.standard_normal(s) for n, s in (("q", (2, 4, 70, 16)), ("k", (2, 2, 75, 16)), ("v", (2, 2, 75, 16)))}
    got = session(device, Package.from_bytes(compile_model(model)), device_class).run("infer", vals)["o"]
    tq, tk, tv = (torch.tensor(vals[n]) for n in "qkv")
    mask = None
    if causal:  # the last query sees every key (offset T - S), as the op defines it
        mask = torch.ones(70, 75, dtype=torch.bool).tril(diagonal=5)
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk.repeat_interleave(2, 1), tv.repeat_interleave(2, 1),
                                                           attn_mask=mask).numpy()
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


@pytest.mark.parametrize("d", [128, 160])
def test_wide_heads_stage_fewer_keys(d, device):
    """Heads wider than 128 stage fewer than 32 keys per tile, so that the forward kernel's
    workgroup memory stays within 32 KiB (160: 25 keys, 32,000 bytes; it would take 40 KiB);
    the GPU kernel against torch, keys spanning several tiles."""
    import torch
    from meganeura.runtime.package import workgroup_bytes

    rng = np.random.default_rng(9)
    shapes = {"q": (1, 2, 70, d), "k": (1, 2, 60, d), "v": (1, 2, 60, d)}
    b = Builder()
    ins = {n: b.input(n, s) for n, s in shapes.items()}
    b.output("o", b.attention(ins["q"], ins["k"], ins["v"]))
    pkg = Package.from_bytes(compile_model(b.build()))
    fwd = next(k["wgsl"] for k in pkg.manifest["kernels"] if k["label"] == "attention")
    assert workgroup_bytes(fwd) == (32768 if d == 128 else 32000)
    assert f"const TILE: u32 = {32 if d == 128 else 25}u;" in fwd
    vals = {n: rng.standard_normal(s) for n, s in shapes.items()}
    got = Session(device, pkg, device_class="gpu").run("infer", vals)["o"]
    ref = torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(vals[n]) for n in "qkv")).numpy()
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


@pytest.mark.parametrize("d, keys, causal", [(160, 60, False), (80, 700, True), (68, 75, True)])
def test_quick_attention_loops_over_wide_heads(d, keys, causal, device):
    """From QUICK_LOOPS_FROM vec4s a head, the quick tier's forward kernel keeps the head
    dimension in loops (cheap to compile): against torch, keys in several tiles, split keys
    (700) merged after, a causal mask, and a width that is not a multiple of 16 (68)."""
    import torch
    from meganeura.compiler.codegen.attention import QUICK_LOOPS_FROM

    assert d // 4 >= QUICK_LOOPS_FROM
    rng = np.random.default_rng(d)
    shapes = {"q": (1, 2, 40, d), "k": (1, 2, keys, d), "v": (1, 2, keys, d)}
    b = Builder()
    ins = {n: b.input(n, s) for n, s in shapes.items()}
    b.output("o", b.attention(ins["q"], ins["k"], ins["v"], causal=causal))
    pkg = Package.from_bytes(compile_model(b.build()))
    quick = [k["wgsl"] for k in pkg.manifest["kernels"] if k["label"].startswith("attention (quick")]
    assert len(quick) == 1 and "var acc: array<vec4<f32>" in quick[0], [k["label"] for k in pkg.manifest["kernels"]]
    vals = {n: rng.standard_normal(s) for n, s in shapes.items()}
    got = session(device, pkg, "quick").run("infer", vals)["o"]
    mask = torch.ones(40, keys, dtype=torch.bool).tril(diagonal=keys - 40) if causal else None
    ref = torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(vals[n]) for n in "qkv"),
                                                           attn_mask=mask).numpy()
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


def test_quick_attentions_of_one_width_share_a_lifted_kernel(device):
    """Two 160-wide attentions that differ in their sizes (40 and 50 query rows, 60 and 50
    keys) run one lifted quick kernel (LOOPED lets the quick tier lift it), each against torch;
    64-wide heads have no quick variant (their kernel written out compiles fast enough)."""
    import torch

    rng = np.random.default_rng(11)
    shapes = {"q1": (1, 2, 40, 160), "k1": (1, 2, 60, 160), "q2": (1, 2, 50, 160), "k2": (1, 2, 50, 160)}
    b = Builder()
    ins = {n: b.input(n, s) for n, s in shapes.items()}
    b.output("o1", b.attention(ins["q1"], ins["k1"], ins["k1"]))
    b.output("o2", b.attention(ins["q2"], ins["k2"], ins["k2"]))
    pkg = Package.from_bytes(compile_model(b.build()))
    quick = {d["variants"]["quick"]["kernel"] for d in pkg.programs["infer"]["dispatches"] if "quick" in d.get("variants", {})
             and pkg.manifest["kernels"][d["variants"]["quick"]["kernel"]]["label"].startswith("attention")}
    assert len(quick) == 1 and pkg.manifest["kernels"][quick.pop()].get("lifted")
    vals = {n: rng.standard_normal(s) for n, s in shapes.items()}
    got = session(device, pkg, "quick").run("infer", vals)
    for i in "12":
        t = torch.tensor(vals["k" + i])
        ref = torch.nn.functional.scaled_dot_product_attention(torch.tensor(vals["q" + i]), t, t).numpy()
        assert np.abs(got["o" + i] - ref).max() / np.abs(ref).max() < 1e-5
    b = Builder()
    q = b.input("q", (1, 2, 40, 64))
    b.output("o", b.attention(q, q, q))
    narrow = Package.from_bytes(compile_model(b.build()))
    assert not any("quick" in d.get("variants", {}) for d in narrow.programs["infer"]["dispatches"])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("device_class", ["cpu", "gpu", "quick"])
def test_fused_attention_with_split_keys(causal, device_class, device):
    """Few query blocks and many keys: the keys are split across workgroups and the partial
    softmaxes merged by a second kernel; same answer as torch."""
    import torch

    rng = np.random.default_rng(8)
    shapes = {"q": (1, 2, 40, 8), "k": (1, 2, 700, 8), "v": (1, 2, 700, 8)}
    b = Builder()
    ins = {n: b.input(n, s) for n, s in shapes.items()}
    b.output("o", b.attention(ins["q"], ins["k"], ins["v"], causal=causal))
    pkg = Package.from_bytes(compile_model(b.build()))
    labels = [pkg.manifest["kernels"][d["kernel"]]["label"] for d in pkg.programs["infer"]["dispatches"]]
    assert labels == ["attention", "attention/merge"], labels
    vals = {n: rng.standard_normal(s) for n, s in shapes.items()}
    got = session(device, pkg, device_class).run("infer", vals)["o"]
    mask = torch.ones(40, 700, dtype=torch.bool).tril(diagonal=660) if causal else None
    ref = torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(vals[n]) for n in "qkv"),
                                                           attn_mask=mask).numpy()
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


@pytest.mark.parametrize("device_class", ["cpu", "gpu", "quick"])
def test_attention_reads_head_transposes_in_place(device_class, device):
    """q, k, v made as [b, t, h, d] and transposed to [b, h, t, d] (as every transformer
    builds them) are read through strides: no transpose kernels, the same answer."""
    import torch
    from meganeura.compiler.passes.prepare import prepare
    from meganeura.compiler.passes.schedule import schedule

    rng = np.random.default_rng(9)
    b = Builder()
    x = b.input("x", (2, 11, 24))
    heads = [b.transpose(b.reshape(b.linear(x, b.param(f"{n}.weight", rng.standard_normal((24, 24)) * 0.3)),
                                   (2, 11, 3, 8)), (0, 2, 1, 3)) for n in "qkv"]
    b.output("o", b.attention(*heads, causal=True))
    model = b.build()
    kinds = [k.kind for k in schedule(prepare(model.graph)).kernels]
    assert "elementwise" not in kinds and kinds.count("attention") == 1, kinds
    X = rng.standard_normal((2, 11, 24))
    got = session(device, Package.from_bytes(compile_model(model)), device_class).run("infer", {"x": X})["o"]
    tx = torch.tensor(X)
    q, k, v = (torch.nn.functional.linear(tx, torch.tensor(model.graph.values[f"{n}.weight"], dtype=torch.float64))
               .view(2, 11, 3, 8)
               .transpose(1, 2) for n in "qkv")
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


def test_convolution_on_128_tiles(device):
    """A convolution big enough for 128x128 tiles (its im2col loads step K by 8): the GPU
    variant against torch."""
    import torch
    from meganeura.compiler.codegen.gemm import gemm_plan

    rng = np.random.default_rng(4)
    assert gemm_plan(CompileOptions().gemm, 128, 2 * 128 * 128, 36, 1, conv=True)[:2] == (128, 8)
    b = Builder()
    x, w = b.input("x", (2, 4, 128, 128)), b.input("w", (128, 4, 3, 3))
    b.output("y", b.conv2d(x, w, padding=(1, 1, 1, 1)))
    X, W = rng.standard_normal((2, 4, 128, 128)), rng.standard_normal((128, 4, 3, 3))
    got = Session(device, Package.from_bytes(compile_model(b.build())), device_class="gpu").run("infer", {"x": X, "w": W})
    ref = torch.nn.functional.conv2d(torch.tensor(X), torch.tensor(W), padding=1).numpy()
    assert np.abs(got["y"] - ref).max() / np.abs(ref).max() < 1e-5


def _tiles_of_128_case(case: str, seed: int):
    """(model, inputs, references) for a 128-tile case: a convolution with both gradients
    ("conv_grads"), a CASES matmul, or a 2050 x 32 @ 32 x 2049 one (K of 4 steps of 8)."""
    if case == "conv_grads":
        return conv_with_gradients((4, 16, 64, 64), (256, 16, 3, 3), 1, seed=seed, w_scale=0.2)
    return matmul_case(*CASES.get(case, ((2050, 32), (32, 2049), False, False)), seed=seed)


@pytest.mark.parametrize("case", ["tiles_of_128_k_contiguous", "tiles_of_128_vec4_rows", "tiles_of_128_transposed",
                                  "tiles_of_128_vec4_k_batched", "tiles_of_128_k_32", "conv_grads"])
def test_128_tile_rows_by_thread_and_half(case, device):
    """128-tile rows typed [thread][half] (A: a thread's two groups of 4 rows side by side) and
    [half][thread] (B: its two groups of 4 columns 64 apart), and an operand staged 4 k at a
    time typed [k / 4][k % 4]: every load layout, a convolution with both gradients, against
    numpy / torch; the inner loop's reads index by the thread's coordinate and constants."""
    model, vals, refs = _tiles_of_128_case(case, seed=9)
    pkg = Package.from_bytes(compile_model(model))
    big = [k["wgsl"] for k in pkg.manifest["kernels"] if "8x8 outputs per thread" in k["wgsl"]]
    assert big
    for code in big:
        lines = [line.strip() for line in code.splitlines()]
        assert any(line.startswith("let a0h = a_tile[0u]") and line.endswith("[ty][1u];") for line in lines), code
        assert any(line.startswith("let b0h = b_tile[0u]") and line.endswith("[1u][tx];") for line in lines), code
        staged_by_k = "4 k of one row at a time" in code  # (an operand staged 4 k at a time)
        depth = max(line.count("array<") for line in code.splitlines() if line.startswith("var<workgroup>"))
        assert depth == 3 + staged_by_k, code
    assert_close(Session(device, pkg, device_class="gpu").run("infer", vals), refs)

"""store4 (compiler/codegen/gemm_store.py): 4 neighbouring GEMM results stored at once, what they
share computed once; and the K loop's steps per trip (the GEMM plan's k_unroll). Checked as text
and against the float64 interpreter in Sessions with wgpu's default checks."""
from __future__ import annotations

import numpy as np
import pytest
from meganeura.compiler import Builder, CompileOptions, compile_model, run_graph
from meganeura.compiler.codegen.gemm_store import store4_body
from meganeura.runtime import Package, Session

EPILOGUE = """    let idx = g * 960u + m * 24u + n;
    let c0_0 = (idx / 960u) % 4u;
    let c0_1 = (idx / 24u) % 40u;
    let c0_2 = (idx / 2u) % 12u;
    let c0_3 = (idx / 1u) % 2u;
    let r0 = t2[c0_1 * 1u];
    let r1 = t3[c0_2 * 1u];
    let r2 = t4[idx];
    let ev0: f32 = (r0 * 2.0);
    let ev1: f32 = ((v * ev0) + r1 + r2 + f32(c0_3));
    t5[idx] = ev1;"""


def _per_column(body: str) -> str:
    return body[body.index("    {"):]


def test_shared_lines_are_the_ones_four_columns_share():
    body = store4_body(EPILOGUE, 24)
    shared = body[:body.index("    {")]
    # the row's channel (idx / 24) and what reads and computes only from it: once
    assert "let idx0 = g * 960u + m * 24u + n0;" in shared
    for line in ("let c0_1 = (idx0 / 24u) % 40u;", "let r0 = t2[c0_1 * 1u];", "let ev0: f32 = (r0 * 2.0);"):
        assert line in shared, line
    # strides 2 and 1 differ within a group of 4 columns; the flat index and v always do
    column = _per_column(body)
    for line in ("let c0_2 = (idx / 2u) % 12u;", "let r1 = t3[c0_2 * 1u];", "let r2 = t4[idx];", "t5[idx] = ev1;"):
        assert line in column and line not in shared, line
    assert column.count("    {") == 4 and "let v = v4.w;" in column and "let n = n0 + 3u;" in column


@pytest.mark.parametrize("store, n", [
    (EPILOGUE, 26),  # columns not in whole groups of 4: a group may straddle the edge
    (EPILOGUE.replace("m * 24u", "m * 26u"), 24),  # a row stride that moves n0 % 4
    ("    if (n > 3u) {\n        return;\n    }\n    c[n] = v;", 24),  # control flow: not parsed
    # a convolution's store (no flat index) whose columns do not come in 4s
    ("    let nb = n / 25u;\n    let pix = (n / 1u) % 25u;\n    c[(nb * 16u + m) * 25u + pix] = v;", 50),
])
def test_what_store4_cannot_share_falls_back_to_four_stores(store, n):
    assert store4_body(store, n).splitlines() == [
        f"    store(g, slice, m, n0 + {i}u, v4.{c});" for i, c in enumerate("xyzw")]


def _run(model, vals, device, options=None):
    pkg = Package.from_bytes(compile_model(model, options=options))
    got = Session(device, pkg, device_class="gpu").run("infer", vals)
    ref = run_graph(model.graph, vals)[0]
    for k, r in ref.items():
        assert np.abs(got[k] - r).max() / np.abs(r).max() < 1e-5, k
    return [k["wgsl"] for k in pkg.manifest["kernels"] if "var<workgroup> a_tile" in k["wgsl"]]  # the GPU GEMMs


@pytest.mark.parametrize("m, k, n", [(37, 48, 52), (2050, 40, 2048), (37, 3000, 52), (37, 48, 50)],
                         ids=["32-tiles", "128-tiles", "split-k", "ragged-columns"])
def test_matmul_epilogue_through_store4(m, k, n, device):
    """A per-row scale (shared by a group of 4 columns), a per-column bias and a residual (not),
    GELU, in the matmul's store4, against the float64 interpreter."""
    rng = np.random.default_rng(n + k)
    b = Builder()
    x, res, scale = b.input("x", (m, k)), b.input("res", (m, n)), b.input("scale", (m, 1))
    w, bias = b.param("w", rng.standard_normal((n, k)) / np.sqrt(k)), b.param("bias", rng.standard_normal(n))
    b.output("y", b.gelu(b.linear(x, w, bias)) * scale + res)
    vals = {"x": rng.standard_normal((m, k)), "res": rng.standard_normal((m, n)), "scale": rng.standard_normal((m, 1))}
    gpu = _run(b.build(), vals, device)
    assert gpu and all(_shares(w) == (n % 4 == 0 and k != 3000) for w in gpu), \
        "store4 shares the row's lines exactly where columns come in 4s (split-K: partials, nothing to share)"


@pytest.mark.parametrize("hw", [10, 5], ids=["pixels-in-4s", "odd-pixels"])
def test_conv_store_through_store4(hw, device):
    """A convolution's store splits n into image and pixel: 4 neighbouring pixels share the
    image when an image's pixels come in 4s. (The scale, shift and ReLU run as a kernel of their
    own: convolutions take no epilogue.)"""
    rng = np.random.default_rng(hw)
    b = Builder()
    x = b.input("x", (2, 8, hw, hw))
    w = b.param("w", rng.standard_normal((16, 8, 3, 3)) / 8)
    s, t = b.input("s", (1, 16, 1, 1)), b.input("t", (1, 16, 1, 1))
    b.output("y", b.relu(b.conv2d(x, w, padding=(1, 1, 1, 1)) * s + t))
    vals = {"x": rng.standard_normal((2, 8, hw, hw)), "s": rng.standard_normal((1, 16, 1, 1)),
            "t": rng.standard_normal((1, 16, 1, 1))}
    gpu = _run(b.build(), vals, device)
    assert gpu and all(_shares(w) == (hw * hw % 4 == 0) for w in gpu)
    assert all("let nb = n0 / " in w for w in gpu) == (hw * hw % 4 == 0)


def _shares(wgsl: str) -> bool:
    """Whether a kernel's store4 computes anything once for its 4 columns."""
    start = wgsl.index("fn store4(")
    lines = wgsl[start:wgsl.index("\n}\n", start)].splitlines()[1:]
    if lines[0].strip().startswith("if ("):  # the edge guard
        lines = lines[lines.index("    }") + 1:]
    return not lines[0].strip().startswith(("{", "store("))


STEPS_CASES = {"128-even": ((2050, 64, 2048), {2, 4}), "128-odd-steps": ((2050, 40, 2048), set()),
               "32-even": ((37, 96, 52), {2}), "32-odd-steps": ((37, 48, 52), set()),
               "split-k": ((37, 4096, 52), {2, 4}),
               # slices of 6 steps but the last of 3 (K 5136 = 53 x 96 + 48); slices of 5 (K 544 = 6 x 80 + 64)
               "split-k-odd-last": ((37, 5136, 52), set()), "split-k-odd-slices": ((37, 544, 52), set())}
# (shape, the steps per trip it takes, of 2 and 4)


@pytest.mark.parametrize("steps", [1, 2, 4])
@pytest.mark.parametrize("case", list(STEPS_CASES))
def test_k_steps_per_loop_trip(case, steps, device):
    """The GEMM plan's k_unroll / k_unroll_small: the K loop does `steps` K steps per trip where
    every split-K slice's steps divide by it (else one), with the same results."""
    (m, k, n), takes = STEPS_CASES[case]
    rng = np.random.default_rng(k)
    b = Builder()
    b.output("y", b.input("x", (m, k)) @ b.param("w", rng.standard_normal((k, n)) / np.sqrt(k)))
    options = CompileOptions().replace(gemm={"k_unroll": steps, "k_unroll_small": steps})
    gpu = _run(b.build(), {"x": rng.standard_normal((m, k))}, device, options)
    (kernel,) = gpu
    assert ("acc0l" in kernel) == case.startswith("128")
    assert (f"{steps} K steps per loop trip" in kernel) == (steps in takes)
    assert kernel.count("k0 = k0 + BK;" if case.startswith("128") else "k0 = k0 + 16u;\n") == \
        (steps - 1 if steps in takes else 0)


@pytest.mark.parametrize("k, steps", [(512, 4), (528, 2), (520, 1), (256, 2)])
def test_long_k_takes_more_steps_per_trip(k, steps, device):
    """128-tiles whose slices span the GEMM plan's long_k (512) or more take k_unroll_long (4) K steps
    per trip where they divide the slice, else k_unroll's 2 where those do, else 1."""
    rng = np.random.default_rng(k)
    b = Builder()
    b.output("y", b.input("x", (2050, k)) @ b.param("w", rng.standard_normal((k, 2048)) / np.sqrt(k)))
    (kernel,) = _run(b.build(), {"x": rng.standard_normal((2050, k))}, device)
    assert "acc0l" in kernel and kernel.count("k0 = k0 + BK;") == steps - 1
    assert (f"{steps} K steps per loop trip" in kernel) == (steps > 1)

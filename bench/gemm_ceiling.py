"""How far naga's WGSL can take f32 multiply-adds on this GPU: an FMA throughput peak
(independent accumulators, no memory), then standalone GEMM variants at 4096^3
(bench/kernels/gemm_variant.wgsl: tile shapes, outputs per thread, warp layouts, fma() or
a * b + c) against cuBLAS fp32 (TF32 off) in the same process. Experiments for the
compiler's 128-tile plan (CompileOptions.gemm, compiler/codegen/plans.py), not used by it.

    python bench/gemm_ceiling.py [--size 4096] [--out DIR] [--no-torch] [--skip-fma] [--bisect | --checks]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from meganeura.compiler.codegen.wgsl import fill  # noqa: E402
from timing import GpuTimer  # noqa: E402

KERNELS = Path(__file__).resolve().parent / "kernels"
# (tile rows, tile cols, rows per thread, cols per thread, BK, warp layout across x down, fma builtin);
# 128x128, 8x8, 16 x 2 warps is the compiler's layout (which steps K by 8, not 16)
VARIANTS = [
    (128, 128, 8, 8, 16, "16x2", False), (128, 128, 8, 8, 16, "16x2", True), (128, 128, 8, 8, 16, "8x4", False),
    (128, 128, 8, 8, 16, "4x8", False), (128, 128, 8, 8, 8, "16x2", False), (128, 128, 8, 8, 8, "8x4", False),
    (128, 256, 8, 16, 8, "16x2", False), (128, 256, 8, 16, 16, "16x2", False), (128, 256, 8, 16, 8, "8x4", False),
    (128, 256, 8, 16, 8, "4x8", False), (256, 128, 16, 8, 8, "16x2", False), (256, 128, 16, 8, 8, "8x4", False),
    (256, 128, 16, 8, 8, "4x8", False),
]


def variant_name(tm, tn, rm, rn, bk, warps, use_fma) -> str:
    return f"{tm}x{tn} {rm}x{rn} bk{bk} warps {warps}" + (" fma()" if use_fma else "")


def _render(name: str, **holes) -> str:
    return fill((KERNELS / f"{name}.wgsl").read_text(), **holes)


def gemm_wgsl(m, n, k, tm, tn, rm, rn, bk, warps, use_fma) -> str:
    tx, ty = tn // rn, tm // rm  # threads across columns and rows
    assert tx * ty == 256 and rm % 4 == 0 and rn % 4 == 0
    ga, gb = rm // 4, rn // 4  # a thread's row groups and column groups of 4
    across = int(warps.split("x")[0])  # a warp: `across` threads across, 32 / across down
    if across == tx:  # as local_invocation_index lays them out
        xy = f"    let tx = tid % {tx}u;\n    let ty = tid / {tx}u;"
    else:  # the warps tile the workgroup
        wx = tx // across
        xy = (f"    let lane = tid % 32u;\n    let warp = tid / 32u;\n"
              f"    let tx = (warp % {wx}u) * {across}u + lane % {across}u;\n"
              f"    let ty = (warp / {wx}u) * {32 // across}u + lane / {across}u;")
    per_a, per_b = tm * bk // 4 // 256, tn * bk // 4 // 256  # vec4s each thread stages per step
    index, load, store = [], [], []
    for j in range(per_a):  # A: 4 k of one row per vec4 (A is K-contiguous), stored as 4 tile entries
        e = f"(tid + {256 * j}u)"
        index.append(f"    let aq{j} = {e} % {bk // 4}u;\n    let ar{j} = {e} / {bk // 4}u;")
        load.append(f"pa{j} = a[((row0 + ar{j}) * K + KB) / 4u + aq{j}];")
        store += [f"        a_tile[(aq{j} * 4u + {i}u) * {tm // 4}u + ar{j} / 4u][ar{j} % 4u] = pa{j}.{c};"
                  for i, c in enumerate("xyzw")]
    for j in range(per_b):  # B: 4 columns of one k per vec4
        e = f"(tid + {256 * j}u)"
        index.append(f"    let bg{j} = {e} % {tn // 4}u;\n    let bk{j} = {e} / {tn // 4}u;")
        load.append(f"pb{j} = b[((KB + bk{j}) * N + col0) / 4u + bg{j}];")
        store.append(f"        b_tile[bk{j} * {tn // 4}u + bg{j}] = pb{j};")
    inner = []
    for kk in range(bk):
        inner += [f"        let a{kk}_{i} = a_tile[{kk * tm // 4}u + ty + {i * ty}u];" for i in range(ga)]
        inner += [f"        let b{kk}_{j} = b_tile[{kk * tn // 4}u + tx + {j * tx}u];" for j in range(gb)]
        for i in range(ga):
            for r, comp in enumerate("xyzw"):
                for j in range(gb):
                    acc, av, bv = f"acc{i}_{r}_{j}", f"a{kk}_{i}.{comp}", f"b{kk}_{j}"
                    inner.append(f"        {acc} = fma(vec4<f32>({av}), {bv}, {acc});" if use_fma
                                 else f"        {acc} = {acc} + {av} * {bv};")
    decl = "\n".join(f"    var acc{i}_{r}_{j} = vec4<f32>(0.0);" for i in range(ga) for r in range(4) for j in range(gb))
    stores = "\n".join(f"    c[((row0 + (ty + {i * ty}u) * 4u + {r}u) * N + col0) / 4u + tx + {j * tx}u] = acc{i}_{r}_{j};"
                       for i in range(ga) for r in range(4) for j in range(gb))
    return _render("gemm_variant", M=m, N=n, K=k, BK=bk, TM=tm, TN=tn, A_STAGED=bk * tm // 4, B_STAGED=bk * tn // 4,
                   THREAD_XY=xy, INDEX="\n".join(index), ACC_DECL=decl,
                   LOAD_FIRST="\n".join(f"    var {x.replace('KB', 'k0')}" for x in load),
                   STORE_TILES="\n".join(store), LOAD_NEXT="\n".join(f"            {x.replace('KB', '(k0 + BK)')}" for x in load),
                   INNER="\n".join(inner), STORES=stores)


def fma_wgsl(vec: bool, chains: int, iters: int, use_fma: bool) -> str:
    t = "vec4<f32>" if vec else "f32"
    step = [f"        c{i} = fma(c{i}, x, y);" if use_fma else f"        c{i} = c{i} * x + y;" for i in range(chains)]
    return _render("fma_peak", T=t, ITERS=iters, DECL="\n".join(f"    var c{i} = {t}(f32({i}));" for i in range(chains)),
                   BODY="\n".join(step * 8), SUM=" + ".join(f"c{i}" for i in range(chains)))


class Runner:
    def __init__(self):
        import wgpu
        from meganeura.runtime.device import default_device
        from meganeura.runtime.native import shader_module

        self.wgpu, self.dev, self.module = wgpu, default_device(), shader_module
        self.timer = GpuTimer(self.dev)

    def buffer(self, data=None, size=None):
        usage = self.wgpu.BufferUsage
        buf = self.dev.create_buffer(size=size or data.nbytes, usage=usage.STORAGE | usage.COPY_DST | usage.COPY_SRC)
        if data is not None:
            self.dev.queue.write_buffer(buf, 0, data)
        return buf

    def pipeline(self, code, buffers, checked=False):
        """`checked`: as native.shader_module takes it (all checks, none, or some)."""
        t0 = time.perf_counter()
        module = self.module(self.dev, code, "x", checked)
        p = self.dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        made = time.perf_counter() - t0
        group = self.dev.create_bind_group(layout=p.get_bind_group_layout(0), entries=[
            {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(buffers)])
        return p, group, made

    def time(self, p, group, grid, per_pass=10, passes=5, warm_first=False) -> float:
        """Median seconds per dispatch over `passes` passes of `per_pass` dispatches
        (`warm_first`: each timed pass follows an untimed dispatch in the same submission,
        so that the GPU is busy, and clocked up, when the timed one starts)."""
        out = []
        for i in range(passes + 1):
            enc = self.dev.create_command_encoder()
            if warm_first:
                self._dispatch(enc.begin_compute_pass(), p, group, grid, 1)
            self._dispatch(enc.begin_compute_pass(**self.timer.pass_kwargs()), p, group, grid, per_pass)
            self.timer.finish(enc)
            self.dev.queue.submit([enc.finish()])
            s = self.timer.seconds()
            if i:  # the first pass warms up
                out.append(s / per_pass)
        return float(np.median(out))

    @staticmethod
    def _dispatch(cp, p, group, grid, count):
        cp.set_pipeline(p)
        cp.set_bind_group(0, group)
        for _ in range(count):
            cp.dispatch_workgroups(*grid)
        cp.end()

    def read(self, buf, dtype=np.float32):
        return np.frombuffer(self.dev.queue.read_buffer(buf), dtype)


def fma_peak(run: Runner, rows: list, threads: int):
    for vec in (False, True):
        for chains in (4, 8, 16):
            for use_fma in (False, True):
                iters = max(8, 4096 // (chains * (4 if vec else 1)))
                out = run.buffer(size=threads * (16 if vec else 4))
                p, g, made = run.pipeline(fma_wgsl(vec, chains, iters, use_fma), [out])
                s = run.time(p, g, (threads // 256, 1, 1), per_pass=5, passes=3)
                flops = 2.0 * threads * iters * 8 * chains * (4 if vec else 1)
                rows.append({"bench": "fma", "vec4": vec, "chains": chains, "fma_builtin": use_fma,
                             "tflops": flops / s / 1e12, "us": s * 1e6, "compile_ms": made * 1e3})
                print(f"fma {'vec4' if vec else 'f32 '} chains {chains:2d} {'fma()' if use_fma else 'a*b+c'}: "
                      f"{flops / s / 1e12:6.1f} TFLOP/s", flush=True)


def _operands(run: Runner, size: int):
    """Random size x size A and B on the GPU, C's buffer, and float64 A @ B's first 64 rows."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    return [run.buffer(a), run.buffer(b), run.buffer(size=size * size * 4)], (a[:64].astype(np.float64) @ b)


def _timed(run: Runner, bench: str, name: str, code: str, size: int, tile: tuple, operands, rows: list, **kw):
    """Time kernel `code` on `operands` and check its first 64 rows of C; a row of results."""
    buffers, ref = operands
    p, g, made = run.pipeline(code, buffers, kw.pop("checked", False))
    t = run.time(p, g, (size // tile[1], size // tile[0], 1), **kw)
    err = float(np.abs(run.read(buffers[2]).reshape(size, size)[:64] - ref).max() / np.abs(ref).max())
    rows.append({"bench": bench, "variant": name, "us": t * 1e6, "tflops": 2 * size ** 3 / t / 1e12,
                 "max_rel_err": err, "compile_ms": made * 1e3})
    print(f"{bench} {size}^3 {name:34s}: {t * 1e6:8.1f} us  {2 * size ** 3 / t / 1e12:5.1f} TFLOP/s  "
          f"err {err:.1e}  compile {made * 1e3:.0f} ms", flush=True)
    assert err < 1e-4, (name, err)


def gemms(run: Runner, size: int, rows: list, torch_ok: bool):
    if torch_ok:
        _torch_single(size, rows)
    operands = _operands(run, size)
    for v in VARIANTS:
        if size % v[0] == 0 and size % v[1] == 0:
            _timed(run, "gemm", variant_name(*v), gemm_wgsl(size, size, size, *v), size, v[:2], operands, rows)


def _compiled_kernel(size: int, options=None) -> str:
    """The compiler's kernel for x @ w at size^3 (bench/run.py's gemm_* workloads)."""
    from meganeura.compiler import Builder, compile_model
    from meganeura.runtime import Package

    b = Builder()
    b.output("y", b.matmul(b.input("x", (size, size)), b.param("w", np.zeros((size, size), np.float32))))
    pkg = Package.from_bytes(compile_model(b.build(), options=options))
    (k,) = [k for k in pkg.manifest["kernels"] if k["label"] == "matmul"]
    return k["wgsl"]


# the compiler's kernel with one difference from gemm_variant.wgsl's taken out at a time
BISECT = {
    "no edge guards on loads": [("    if (m >= M || k >= K) {\n        return vec4<f32>(0.0);\n    }\n", ""),
                                ("    if (k >= K || n >= N) {\n        return vec4<f32>(0.0);\n    }\n", "")],
    "constant K bound": [("let k_end = min(K, (slice + 1u) * KS);", "let k_end = K;")],
    "no edge guard on stores": [("    if (m >= M || n >= N) {\n        return;\n    }\n", "")],
    "one-dimensional workgroup": [("@compute @workgroup_size(16, 16)", "@compute @workgroup_size(256)"),
                                  ("@builtin(local_invocation_id) lid: vec3<u32>", "@builtin(local_invocation_index) tid: u32"),
                                  ("    let tid = lid.y * 16u + lid.x;\n", ""),
                                  ("    let tx = lid.x;\n    let ty = lid.y;", "    let tx = tid % 16u;\n    let ty = tid / 16u;")],
}


def _torch_single(size: int, rows: list):
    """cuBLAS one call per timed region with a sync between (as bench/run.py times PyTorch),
    and the same after an untimed call in the stream."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    ta, tb = (torch.randn(size, size, device="cuda") for _ in range(2))
    for warm in (False, True):
        times = []
        for i in range(21):
            torch.cuda.synchronize()
            if warm:
                ta @ tb
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            ta @ tb
            e.record()
            torch.cuda.synchronize()
            if i:
                times.append(s.elapsed_time(e) * 1e3)
        how = "cuBLAS, one call" + (" after an untimed one" if warm else "")
        rows.append({"bench": "harness", "variant": how, "us": float(np.median(times))})
        print(f"{size}^3 {how:43s}: {np.median(times):8.1f} us", flush=True)


def bisect(run: Runner, size: int, rows: list, torch_ok: bool = False):
    if torch_ok:
        _torch_single(size, rows)
    base = _compiled_kernel(size)
    operands = _operands(run, size)
    variants = {"as compiled": base}
    for name, edits in BISECT.items():
        if not all(old in base for old, _ in edits):
            print(f"compiled {size}^3 {name:28s}: already so in the compiler's kernel", flush=True)
            continue
        code = base
        for old, new in edits:
            code = code.replace(old, new)
        variants[name] = code
    everything = base
    for edits in BISECT.values():
        for old, new in edits:
            everything = everything.replace(old, new)
    variants["all of them"] = everything
    for name, code in variants.items():
        _timed(run, "compiled", name, code, size, (128, 128), operands, rows)
        if name == "as compiled":  # how the harness itself moves the number (bench/run.py: one per pass)
            for how, kw in (("one dispatch per pass", {"per_pass": 1, "passes": 20}),
                            ("one per pass after an untimed one", {"per_pass": 1, "passes": 20, "warm_first": True})):
                _timed(run, "compiled", f"as compiled, {how}", code, size, (128, 128), operands, rows, **kw)


# changes to the GEMM plan (CompileOptions().replace(gemm=...)); plans of switches since removed
# (two tile buffers, 128-tile rows as [group]: bench/REJECTED.md) are in older result files only
CHECK_PLANS = {"1 K step per trip": {"k_unroll": 1, "k_unroll_long": 1},
               "2 K steps per trip": {"k_unroll_long": 2},
               "4 K steps per trip": {"k_unroll_long": 4}}


def checks(run: Runner, size: int, rows: list, torch_ok: bool = False, only=None):
    """The compiled kernel with and without wgpu's shader checks (the Session's default has
    them), under CHECK_PLANS' GEMM plans."""
    from meganeura.compiler import CompileOptions

    if torch_ok:
        _torch_single(size, rows)
    operands = _operands(run, size)
    variants = {}
    for name, plan in CHECK_PLANS.items():
        if only and not any(o in name for o in only):
            continue
        variants[name] = _compiled_kernel(size, CompileOptions().replace(gemm=plan))
    from meganeura.runtime.native import BOUNDS_CHECKS, LOOP_BOUNDING

    modes = {"checked": True, "unchecked": False, "bounds checks only": BOUNDS_CHECKS,
             "loop bounding only": LOOP_BOUNDING}
    for _ in range(2):  # twice over: the spread between the rounds is the noise
        for name, code in variants.items():
            for mode, checked in modes.items():
                _timed(run, "checks", f"{name}, {mode}", code, size, (128, 128), operands, rows, checked=checked)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--skip-fma", action="store_true")
    ap.add_argument("--bisect", action="store_true", help="the compiler's kernel, its differences taken out one by one")
    ap.add_argument("--checks", action="store_true", help="the compiler's kernel with and without shader checks")
    ap.add_argument("--plans", nargs="*", help="--checks: only the CHECK_PLANS whose names contain one of these")
    ap.add_argument("--fma-threads", type=int, default=132 * 2048 * 4, help="every SM full, several times over")
    ap.add_argument("--out", default="out/bench")
    args = ap.parse_args(argv)
    run, rows = Runner(), []
    if not args.skip_fma:
        fma_peak(run, rows, args.fma_threads)
    if args.checks:
        checks(run, args.size, rows, not args.no_torch, args.plans)
    elif args.bisect:
        bisect(run, args.size, rows, not args.no_torch)
    else:
        gemms(run, args.size, rows, not args.no_torch)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemm_ceiling.json").write_text(json.dumps({"device": run.dev.adapter.info.get("device"), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

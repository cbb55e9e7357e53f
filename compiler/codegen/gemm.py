"""GEMM-shaped kernels: matmul and the implicit-GEMM tiles convolutions share (igemm*.wgsl).

The tile plan comes from the shape and the schedule's GEMM plan (`gemm_plan`; the plan's
defaults, codegen/plans.py, are tuned on the GPU with bench/gemm_policy.py). The loads stage each
operand along its contiguous dimension, 16 bytes at a time where it is aligned; elementwise
consumers may run in the store (epilogues).
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import cache

import numpy as np

from ...runtime.package import QUICK
from ..passes.records import Kernel, Schedule, base_of
from .common import (
    MAX_GROUPS,
    WG,
    Bindings,
    KernelCode,
    as_vec4,
    ew_code,
    grid,
    per_output,
    shared_loads,
    strides_of,
    tile_type,
)
from .gemm_store import store4_body
from .wgsl import render, template


def gemm_plan(plan: Mapping, m: int, n: int, k: int, groups: int, conv: bool = False) -> tuple:
    """(tile, K step, split-K slices) for an M x N x K GEMM repeated `groups` times under the
    GEMM plan `plan` (options.gemm); `conv`: an implicit GEMM whose loads compute im2col windows."""
    def tiles(t):
        return -(-m // t) * -(-n // t) * groups

    fill = plan["fill"]
    # large tiles only when they still fill the GPU and M and N fill them
    if tiles(128) >= 256 and min(m, n) >= plan["big_min_side"]:
        return 128, plan["big_bk_conv" if conv else "big_bk"], 1
    if tiles(64) >= fill:
        return 64, 16, 1
    short = k <= plan["short_k"]
    tile = 32 if short else 64
    slice_min = plan["slice_min_short" if short else "slice_min"]
    return tile, 16, max(1, min(64, -(-fill // tiles(tile)), k // slice_min))


def k_steps_per_trip(k: int, ks: int, bk: int, want: int) -> int:
    """`want` where every split-K slice's K steps divide by it (ks and k by want * bk), else 1."""
    return want if want > 1 and k % (want * bk) == 0 and ks % (want * bk) == 0 else 1


def _steps128(plan: Mapping, k: int, ks: int, bk: int) -> int:
    """K steps per loop trip on 128-tiles: more where the slices span at least plan["long_k"]."""
    if ks >= plan["long_k"]:
        steps = k_steps_per_trip(k, ks, bk, plan["k_unroll_long"])
        if steps > 1:
            return steps
    return k_steps_per_trip(k, ks, bk, plan["k_unroll"])


def _trips(bodies: list, step: str) -> tuple:
    """A K loop's body doing one K step per entry of `bodies` per trip (each a block of its
    own: the steps' names repeat), and the kernel comment saying so."""
    if len(bodies) == 1:
        return bodies[0], ""
    blocks = [f"        {{\n{body}\n        }}" for body in bodies]
    return f"\n        k0 = k0 + {step};\n".join(blocks), f" {len(bodies)} K steps per loop trip."


def edge_guards(ragged: dict) -> dict:
    """igemm_common's GUARD_* holes, and the conditions (GUARD_COND_*) behind them: only the
    dimensions `ragged` marks (m, n, k: a tile or K step may run past the edge) are checked."""
    def cond(*dims):
        return " || ".join(f"{d} >= {d.upper()}" for d in dims if ragged[d])

    out = {}
    for hole, dims, ret in (("A", "mk", "0.0"), ("B", "kn", "0.0"), ("STORE", "mn", "")):
        c = cond(*dims)
        out[f"GUARD_COND_{hole}"] = c
        out[f"GUARD_{hole}"] = (f"    if ({c}) {{\n        return{' ' + ret if ret else ''};\n    }}" if c
                                else f"    // ({' and '.join(d.upper() for d in dims)}: whole tiles and K steps, unguarded)")
    # (store4's columns n0 .. n0 + 3 lie past the edge together once n0 does)
    out["GUARD_STORE4"] = out["GUARD_STORE"].replace("n >= N", "n0 >= N")
    return out


ALL_GUARDED = edge_guards({"m": True, "n": True, "k": True})


# ---- staging: which tile entries a thread loads, and the loads themselves

def _staging(k_contiguous: bool, index: str, ks: int, groups: int) -> dict:
    """Which tile entry (k, group of 4) thread/entry `index` stages: k fastest when the operand
    is contiguous along K (row-major activations, [out, in] weights), so that neighbouring
    threads read neighbouring addresses; else the group fastest."""
    if k_contiguous:
        return {"K": f"{index} % {ks}u", "G": f"{index} / {ks}u", "ORDER": "k fastest"}
    return {"K": f"{index} / {groups}u", "G": f"{index} % {groups}u", "ORDER": "rows/columns fastest"}


def _group_load(op: str, vec4: bool, k: str, group: str, k0: str) -> str:
    """WGSL for the 4 values of tile entry (k, group) of operand `op` (A: 4 rows at one k; B: 4
    columns), from K step k0: one 16-byte load_a4 / load_b4 (`vec4`), or 4 scalar loads."""
    if op == "a":
        row, kk = f"row0 + {group} * 4u", f"{k0} + {k}"
        if vec4:
            return f"load_a4(g, {row}, {kk})"
        return "vec4<f32>(" + ", ".join(f"load_a(g, {row} + {i}u, {kk})" for i in range(4)) + ")"
    kk, col = f"{k0} + {k}", f"col0 + {group} * 4u"
    if vec4:
        return f"load_b4(g, {kk}, {col})"
    return "vec4<f32>(" + ", ".join(f"load_b(g, {kk}, {col} + {i}u)" for i in range(4)) + ")"


def _quad_load(op: str, quad: str, row: str, k0: str) -> str:
    """WGSL for 4 k (quad `quad` of K step k0) of operand `op`'s row (A) or column (B) `row`."""
    if op == "a":
        return f"load_a4(g, row0 + {row}, {k0} + {quad} * 4u)"
    return f"load_b4(g, {k0} + {quad} * 4u, col0 + {row})"


def _vec4_loader(op: str, body: str, guard: str) -> str:
    args = "m: u32, k: u32" if op == "a" else "k: u32, n: u32"
    check = f"    if ({guard}) {{\n        return vec4<f32>(0.0);\n    }}\n" if guard else ""
    return f"\n\nfn load_{op}4(g: u32, {args}) -> vec4<f32> {{\n{check}{body}\n}}\n"


def _vec4_common(common: str, decls: str, contract: dict, modes, vec4) -> str:
    """igemm_common with the vec4 operands' bindings retyped (as_vec4: array<vec4<f32>>, or
    array<vec2<u32>> for f16 weights), their scalar loaders stubbed out and load_a4 / load_b4 added."""
    if not any(modes):
        return common
    contract4 = dict(contract)
    for op, mode in zip("ab", modes):
        if mode:
            contract4[f"LOAD_{op.upper()}"] = f"    return 0.0;  // read through load_{op}4"
    decls4 = as_vec4(decls, [op for op, mode in zip("ab", modes) if mode])
    return render("igemm_common", BINDINGS=decls4, **contract4) + "".join(
        _vec4_loader(op, v[1], contract[f"GUARD_COND_{op.upper()}"]) for op, mode, v in zip("ab", modes, vec4) if mode)


# ---- 64- and 32-tiles (igemm.wgsl): 4x4 outputs per thread on TG x TG threads

@cache
def inner_step(tg: int) -> str:
    """igemm.wgsl's written-out K step (16 k) for TG x TG threads."""
    return "\n".join(
        f"        let a{kk} = a_tile[{kk}u][ty];\n        let b{kk} = b_tile[{kk}u][tx];\n"
        + "\n".join(f"        acc{r} = acc{r} + a{kk}.{c} * b{kk};" for r, c in enumerate("xyzw"))
        for kk in range(16))


def _stage_entry(tg: int, k_contiguous, modes) -> dict:
    """igemm.wgsl's staging statements for tile entry `e` of A and of B (STAGE_A, STAGE_B) and
    the order their entries take (A_ORDER, B_ORDER)."""
    out, i = {}, 8 * " "
    for op, contiguous, mode in zip("ab", k_contiguous, modes):
        if mode == "k":  # entry e: row e / 4, k quad e % 4, stored as the 4 k entries of its row
            lines = [f"{i}    let q{op} = e % 4u;", f"{i}    let r{op} = e / 4u;",
                     f"{i}    let v{op} = {_quad_load(op, f'q{op}', f'r{op}', 'k0')};"] + [
                f"{i}    {op}_tile[q{op} * 4u + {c}u][r{op} / 4u][r{op} % 4u] = v{op}.{comp};"
                for c, comp in enumerate("xyzw")]
            out[f"{op.upper()}_ORDER"] = "4 k of one row at a time"
        else:
            st = _staging(contiguous and mode is None, "e", 16, tg)
            out[f"{op.upper()}_ORDER"] = st["ORDER"]
            lines = [f"{i}    let {op}k = {st['K']};", f"{i}    let {op}g = {st['G']};",
                     f"{i}    {op}_tile[{op}k][{op}g] = {_group_load(op, mode == 'group', op + 'k', op + 'g', 'k0')};"]
        out[f"STAGE_{op.upper()}"] = "\n".join(lines)
    return out


def _stage_small(tg: int, k_contiguous, modes) -> dict:
    """igemm.wgsl's staging (see _stage_entry), once per tile entry the thread stages with e a
    constant offset from tid, so that the driver's compiler can move what an entry's rows and
    columns cost (a convolution's pixel coordinates) out of the K loop."""
    out = _stage_entry(tg, k_contiguous, modes)
    body = out.pop("STAGE_A") + "\n" + out.pop("STAGE_B")
    assert 16 % tg == 0, tg  # (entries tid + j TG^2 cover 16 TG exactly: no bound to check)
    out["STAGING"] = "\n".join(f"        {{\n            let e = tid + {j * tg * tg}u;\n{body}\n        }}"
                               for j in range(-(-16 * tg // (tg * tg))))
    return out


def _igemm_small(tile: int, k_contiguous, modes, common: str, steps: int) -> str:
    """igemm.wgsl for TILE x TILE output tiles, `steps` K steps of 16 per loop trip."""
    tg = tile // 4
    stage = _stage_small(tg, k_contiguous, modes)
    step = "\n".join([stage.pop("STAGING"), "        workgroupBarrier();", inner_step(tg), "        workgroupBarrier();"])
    body, note = _trips([step] * steps, "16u")
    return render("igemm", COMMON=common, LOOP_BODY=body, STEPS_NOTE=note, TG=tg,
                  TILE_TYPE=tile_type(16, tg, True), **stage)


# ---- 128-tiles (igemm128.wgsl): 8x8 outputs per thread on 16 x 16 threads. A thread's rows are
# two groups of 4 side by side (A's tile rows typed [thread][half]), its columns two groups of 4
# 64 apart (B's typed [half][thread]: neighbouring threads read neighbouring 16-byte entries), so
# that an inner-loop read's only variable index is the thread's coordinate; an operand staged 4 k
# at a time has its K rows typed [k / 4][k % 4] (its 4 stores per step share the quad's index)

GROUPS128, THREADS128 = 32, 256  # groups of 4 in a 128-tile row; threads of a workgroup


def _k_at(op: str, kk: int, quads: tuple) -> str:
    """A 128-tile's K index: `kk`, or [kk / 4][kk % 4] where operand `op` is staged 4 k at a time."""
    return f"{kk // 4}u][{kk % 4}u" if op in quads else f"{kk}u"


def _group_index(op: str, group: str) -> str:
    """The indices of `group` in a 128-tile row: [thread][half] for A, [half][thread] for B."""
    wrap = "2u" if op == "a" else "16u"
    return f"[({group}) / {wrap}][({group}) % {wrap}]"


def _inner128(bk: int, quads: tuple) -> str:
    """igemm128.wgsl's written-out K step: BK rows of the tiles, 64 multiply-adds each."""
    def at(op, kk, half):
        k = _k_at(op, kk, quads)
        return f"a_tile[{k}][ty][{half}]" if op == "a" else f"b_tile[{k}][{half}][tx]"
    return "\n".join(
        f"        let a{kk}l = {at('a', kk, '0u')};\n        let a{kk}h = {at('a', kk, '1u')};\n"
        f"        let b{kk}l = {at('b', kk, '0u')};\n        let b{kk}h = {at('b', kk, '1u')};\n"
        + "\n".join(f"        acc{r}l = acc{r}l + a{kk}{'l' if r < 4 else 'h'}.{'xyzw'[r % 4]} * b{kk}l;\n"
                    f"        acc{r}h = acc{r}h + a{kk}{'l' if r < 4 else 'h'}.{'xyzw'[r % 4]} * b{kk}h;" for r in range(8))
        for kk in range(bk))


def _tile128(bk: int, op: str, quads: tuple) -> str:
    """igemm128.wgsl's tile type for operand `op` (see above)."""
    row = tile_type(GROUPS128 // 2, 2, True) if op == "a" else tile_type(2, GROUPS128 // 2, True)
    return f"array<array<{row}, 4>, {bk // 4}>" if op in quads else f"array<{row}, {bk}>"


def _stage128_quads(op: str, bk: int) -> tuple:
    """Staging of operand `op` read 4 k at a time (load_a4 / load_b4 along K): a warp stages 8
    rows' 16 k (64 contiguous bytes each), each vec4 stored as its row's 4 k entries."""
    index, load, store = [], [], []
    for j in range(GROUPS128 * bk // THREADS128):
        e = f"(tid + {THREADS128 * j}u)"
        index.append(f"    let {op}q{j} = {e} % {bk // 4}u;\n    let {op}r{j} = {e} / {bk // 4}u;")
        load.append(f"p{op}{j} = {_quad_load(op, f'{op}q{j}', f'{op}r{j}', 'KB')};")
        store.append("\n".join(f"        {op}_tile[{op}q{j}][{c}u]{_group_index(op, f'{op}r{j} / 4u')}[{op}r{j} % 4u] = "
                               f"p{op}{j}.{comp};" for c, comp in enumerate("xyzw")))
    return "4 k of one row at a time", index, load, store


def _stage128_groups(op: str, bk: int, contiguous: bool, mode) -> tuple:
    """Staging of operand `op` a tile entry (4 rows of A at one k, 4 columns of B) at a time,
    16 bytes at once where `mode` is "group", else by 4 scalar loads."""
    st = _staging(contiguous and mode is None, "e", bk, GROUPS128)
    index, load, store = [], [], []
    for j in range(GROUPS128 * bk // THREADS128):
        e = f"(tid + {THREADS128 * j}u)"
        index.append(f"    let {op}k{j} = {st['K'].replace('e', e, 1)};\n    let {op}g{j} = {st['G'].replace('e', e, 1)};")
        load.append(f"p{op}{j} = {_group_load(op, mode == 'group', f'{op}k{j}', f'{op}g{j}', 'KB')};")
        store.append(f"        {op}_tile[{op}k{j}]{_group_index(op, f'{op}g{j}')} = p{op}{j};")
    return st["ORDER"], index, load, store


def _stage128(bk: int, k_contiguous, modes, steps: int) -> dict:
    """igemm128.wgsl's staging and K loop: 2 BK / 16 vec4s of A and of B per thread, loaded into
    registers (the next K step's while this one is multiplied) and stored into the tiles after
    the barrier. `modes[i]`: operand i is read 16 bytes at a time through load_a4 / load_b4,
    along its rows or columns ("group": the 4 values a tile entry holds) or along K ("k": 4
    entries' same component, stored one by one); None: 4 scalar loads."""
    quads = tuple(op for op, mode in zip("ab", modes) if mode == "k")
    out, index, load, store = {}, [], [], []
    for op, contiguous, mode in zip("ab", k_contiguous, modes):
        order, i, ld, st = _stage128_quads(op, bk) if mode == "k" else _stage128_groups(op, bk, contiguous, mode)
        out[f"{op.upper()}_ORDER"] = order
        index, load, store = index + i, load + ld, store + st
    prefetch = "\n".join(["        if (k0 + BK < k_end) {  // the next tile's loads run while this one is multiplied"]
                         + [f"            {line.replace('KB', '(k0 + BK)')}" for line in load] + ["        }"])
    step = "\n".join(["\n".join(store), "        workgroupBarrier();", prefetch, _inner128(bk, quads),
                      "        workgroupBarrier();"])
    loop, trips = _trips([step] * steps, "BK")
    return dict(INDEX="\n".join(index), LOAD_FIRST="\n".join(f"    var {line.replace('KB', 'k0')}" for line in load),
                LOOP_BODY=loop, STEPS_NOTE=trips, STAGED=GROUPS128 * bk, BK=bk,
                A_TILE_TYPE=_tile128(bk, "a", quads), B_TILE_TYPE=_tile128(bk, "b", quads), **out)


# ---- the kernels

def _gemm_bindings(bind: Bindings, names, prelude: str, split: int) -> tuple:
    """(declarations, slots, split-K temp or None) of a GEMM kernel: all of `bind`'s, or with
    split-K the loads' two and the partial sums' buffer."""
    all_decls = bind.decls(list(names), loaders=False).splitlines()
    loaders = bind.loaders(list(names), range(2))  # f16 operands widened as they load
    if split == 1:
        return prelude + "\n".join(all_decls) + loaders, bind.list(), None
    temp = bind.sched.new_temp()
    decls = "\n".join(all_decls[:2]) + "\n@group(0) @binding(2) var<storage, read_write> partial: array<f32>;" + loaders
    return decls, bind.list()[:2] + [(temp, "read_write")], temp


def _splitk_sum(bind: Bindings, names, temp, m: int, n: int, groups: int, split: int, store: str, prelude: str,
                label: str) -> KernelCode:
    """The kernel adding up split-K's partial sums and running store() on them: it binds what
    store() reads and writes, after the partials."""
    total = groups * m * n
    body = "\n".join([
        f"    let g = idx / {m * n}u;", f"    let m = (idx / {n}u) % {m}u;", f"    let n = idx % {n}u;",
        "    var v = 0.0;",
        f"    for (var s = 0u; s < {split}u; s++) {{ v += partial[s * {total}u + idx]; }}", store])
    store_decls = bind.decls(list(names), loaders=False).splitlines()[2:]
    decls = "\n".join(["@group(0) @binding(0) var<storage, read> partial: array<f32>;"] + [
        line.replace(f"@binding({i + 2})", f"@binding({i + 1})") for i, line in enumerate(store_decls)])
    wgsl = per_output(decls, total, body.replace("    let idx = g *", "    let _i = g *"), prelude)
    return KernelCode(wgsl, (WG, 1, 1), [(temp, "read")] + bind.list()[2:], grid(-(-total // WG)),
                      label + "/splitk-sum")


# multiply-adds from which the CPU GEMM takes tiles of 8 and 16: a 145x192x576 product runs 3x
# faster on them than on 4x4 tiles, but LLVM takes twice to four times as long over them (each
# operand read is a loop over the SIMD lanes there, written out per tile row and column), each
# time a session loads them: only products big enough to run many times over take them
# (bench/REJECTED.md)
CPU_BIG_TILES_FROM = 1 << 22


def _cpu_variant(common: str, m: int, n: int, z: int, fmas: int, quads: str | None = None) -> tuple:
    """(WGSL, workgroup size, workgroups) of igemm_cpu.wgsl: 4x4 tiles on 8x8 invocations, or
    for big products 16 rows or columns where the shape fills them (else 8) on one row of 8
    invocations (8 rows when one would need more workgroups than a device allows). `quads`
    (`common` with load_a4 / load_b4 along K): big products read 4 k a load, on 8 columns."""
    if fmas < CPU_BIG_TILES_FROM:
        rows = cols = 4
        wy = 8
    else:
        rows, cols = (16 if m >= 128 else 8), (16 if n >= 128 and not quads else 8)
        wy = 1 if -(-m // rows) <= MAX_GROUPS else 8
    if quads is not None and fmas >= CPU_BIG_TILES_FROM:
        common, step, kstep = quads, _cpu_step_k4(rows, cols), 4
    else:
        step, kstep = _cpu_step(rows, cols), 1
    acc = [f"    var acc{i}_{q} = vec4<f32>(0.0);" for i in range(rows) for q in range(cols // 4)]
    store = [f"    store(g, slice, r + {i}u, c + {4 * q + e}u, acc{i}_{q}.{'xyzw'[e]});"
             for i in range(rows) for q in range(cols // 4) for e in range(4)]
    wgsl = render("igemm_cpu", COMMON=common, WY=wy, ROWS=rows, COLS=cols, KSTEP=kstep, ACC_DECL="\n".join(acc),
                  STEP="\n".join(step), STORE_ALL="\n".join(store))
    return wgsl, (8, wy, 1), (-(-n // (8 * cols)), -(-m // (rows * wy)), z)


def _cpu_step(rows: int, cols: int) -> list:
    """One k: the lane's COLS values of B (none past the last column), its rows' A values
    (broadcast: the same for every lane) and the multiply-adds."""
    quads = range(cols // 4)
    step = _lane_reads({f"b{q}": "vec4<f32>(" + ", ".join(f"load_b(g, k, c + {4 * q + e}u)" for e in range(4)) + ")"
                        for q in quads})
    step += shared_loads("a", "load_a(g, r + {}, k)", rows, "lane")
    return step + [f"        acc{i}_{q} = acc{i}_{q} + a{i} * b{q};" for i in range(rows) for q in quads]


def _cpu_step_k4(rows: int, cols: int) -> list:
    """Four k: each of the lane's columns of B and each row of A read as one vec4 along K
    (the rows' broadcast), B's turned into vec4s along the columns, and the multiply-adds."""
    quads = range(cols // 4)
    step = _lane_reads({f"bk{j}": f"load_b4(g, k, c + {j}u)" for j in range(cols)})
    step += [f"        let b{q}_{e} = vec4<f32>(" + ", ".join(f"bk{4 * q + j}.{e}" for j in range(4)) + ");"
             for q in quads for e in "xyzw"]
    step += shared_loads("a", "load_a4(g, r + {}, k)", rows, "lane")
    return step + [f"        acc{i}_{q} = acc{i}_{q} + " + " + ".join(f"a{i}.{e} * b{q}_{e}" for e in "xyzw") + ";"
                   for i in range(rows) for q in quads]


def _lane_reads(reads: dict) -> list:
    """WGSL lines reading the lane's own B values (name -> vec4 expression), zero for a lane
    past the last column."""
    return ([f"        var {name} = vec4<f32>(0.0);" for name in reads] + ["        if (c < N) {"]
            + [f"            {name} = {expr};" for name, expr in reads.items()] + ["        }"])


def _slower_variants(common: str, m: int, n: int, z: int, fmas: int, quads: str | None = None) -> dict:
    """The CPU rasterisers' kernel (barrier-free, same bindings and split) and, unless its
    16-tiles need more workgroups than a device allows, the quick tier's (Session(quick_start=
    True): fast to compile, run until the tuned kernel has compiled)."""
    variants = {"cpu": _cpu_variant(common, m, n, z, fmas, quads)}
    quick_groups = (-(-n // 16), -(-m // 16), z)
    if max(quick_groups) <= MAX_GROUPS:
        variants[QUICK] = (render("igemm_quick", COMMON=common), (16, 16, 1), quick_groups)
    return variants


def igemm(bind: Bindings, m: int, n: int, k: int, groups: int, load_a: str, load_b: str, store: str,
          label: str, names=("a", "b", "c"), prelude: str = "", k_contiguous=(False, False), vec4=(None, None),
          conv: bool = False):
    """Implicit-GEMM kernel(s) from WGSL bodies of load_a(g, m, k), load_b(g, k, n) and
    store(g, m, n, v). Returns one KernelCode, or two with split-K (partials + sum).
    The first 2 bindings are the operands A and B, the others store()'s (the output, and an
    epilogue's inputs). `prelude`: WGSL helpers the store uses.
    `k_contiguous`: whether A and B are laid out along K in memory (how to stage them).
    `vec4`: per operand None, or (mode, body of load_a4(g, m, k) / load_b4(g, k, n) -> vec4,
    reading its binding as as_vec4 retypes it (bind.element4)), used by every tile size
    (see _stage128, _stage_entry). `conv`: the loads compute im2col windows (the plan steps K
    differently)."""
    plan = bind.sched.options.gemm
    tile, bk, split = gemm_plan(plan, m, n, k, groups, conv)
    ks = -(-(-(-k // split)) // bk) * bk  # slice length, a multiple of the K step
    split = -(-k // ks)
    # with split-K, the GEMM kernel writes [slice, g, m, n] partials into a temp buffer
    st = store if split == 1 else f"    partial[((slice * {groups}u + g) * {m}u + m) * {n}u + n] = v;"
    contract = dict(M=m, N=n, K=k, SPLIT=split, KS=ks, LOAD_A=load_a, LOAD_B=load_b, STORE=st,
                    STORE4=store4_body(st, n))
    # the GPU kernels' tiles step M and N by `tile` and K by `bk` from 0 (slices: multiples of
    # bk): a dimension they divide never runs past its edge
    gpu_contract = {**contract, **edge_guards({"m": m % tile != 0, "n": n % tile != 0, "k": k % bk != 0})}
    decls, slots, temp = _gemm_bindings(bind, names, prelude, split)
    modes = [v[0] if v else None for v in vec4]
    common = _vec4_common(render("igemm_common", BINDINGS=decls, **gpu_contract), decls, gpu_contract, modes, vec4)
    if tile == 128:
        wgsl, tg = render("igemm128", COMMON=common, **_stage128(bk, k_contiguous, modes, _steps128(plan, k, ks, bk))), 16
    else:
        assert bk == 16, bk  # igemm.wgsl steps K by 16: the edge guards above assume the plan's K step
        steps = k_steps_per_trip(k, ks, bk, plan["k_unroll_small"])
        wgsl, tg = _igemm_small(tile, k_contiguous, modes, common, steps), tile // 4
    code = KernelCode(wgsl, (tg, tg, 1), slots, (-(-n // tile), -(-m // tile), groups * split), label)
    guarded = {**contract, **ALL_GUARDED}
    quads = _vec4_common("", decls, guarded, modes, vec4) if modes == ["k", "k"] else None  # (K % 4 == 0)
    code.variants = _slower_variants(render("igemm_common", BINDINGS=decls, **guarded), m, n, groups * split,
                                     m * n * k * groups, quads)
    if split == 1:
        return code
    code.temps = {temp: split * groups * m * n * 4}
    return [code, _splitk_sum(bind, names, temp, m, n, groups, split, store, prelude, label)]


def _batch_offset(batch_shape, src_shape, var):
    """WGSL for the element offset of batch `g` within an operand with (broadcast) batch dims."""
    terms = []
    bst = strides_of(batch_shape)
    lead = len(batch_shape) - (len(src_shape) - 2)
    sst = strides_of(src_shape)
    for d in range(len(batch_shape)):
        if batch_shape[d] == 1 or d < lead or src_shape[d - lead] == 1:
            continue
        terms.append(f"((g / {bst[d]}u) % {batch_shape[d]}u) * {sst[d - lead]}u")
    return f"    let {var} = {' + '.join(terms) if terms else '0u'};"


def _matmul_store(sched: Schedule, k: Kernel, bind: Bindings, r: int, m_: int, n_: int) -> tuple:
    """(store() body, binding names, prelude, label) of matmul kernel `k` whose product is `r`:
    its elementwise consumers computed in the store (the product never touches memory), or
    the product written to its own binding c."""
    g = sched.graph
    if k.epilogue:
        coords, body, uses_prelude = ew_code(sched, k.epilogue, k.roots, bind, given={r: "v"})
        store = "\n".join([f"    let idx = g * {m_ * n_}u + m * {n_}u + n;"] + coords + body)
        label = "matmul+" + "+".join(sorted({g.nodes[e].op for e in k.epilogue}))
        names = ["a", "b"] + [f"t{j}" for j in range(2, len(bind.slots))]
        return store, names, template("prelude") + "\n" if uses_prelude else "", label
    bind.use(r, write=True, own=True)
    return f"    c[g * {m_ * n_}u + m * {n_}u + n] = v;", ["a", "b", "c"], "", "matmul"


def matmul(sched: Schedule, k: Kernel) -> KernelCode:
    g = sched.graph
    r = k.product if k.epilogue else k.roots[0]
    n = g.nodes[r]
    a, b = (g.nodes[i] for i in n.inputs)
    ta, tb = bool(n.attr("trans_a")), bool(n.attr("trans_b"))
    m_, n_ = n.shape[-2], n.shape[-1]
    k_ = a.shape[-2] if ta else a.shape[-1]
    sam, sak = (1, a.shape[-1]) if ta else (a.shape[-1], 1)
    sbk, sbn = (1, b.shape[-1]) if tb else (b.shape[-1], 1)
    batch_shape = n.shape[:-2]
    bind = Bindings(sched)
    loads, offsets = [], []
    for op, i, (s_row, s_col), strides in (("a", n.inputs[0], ("m", "k"), (sam, sak)),
                                           ("b", n.inputs[1], ("k", "n"), (sbk, sbn))):
        x = base_of(g, i)
        offsets.append(_batch_offset(batch_shape, g.nodes[i].shape, "off"))
        bind.use(x, own=True)
        loads.append(offsets[-1] + f"\n    return {bind.element(x, op, f'off + {s_row} * {strides[0]}u + {s_col} * {strides[1]}u')};")
    bind.shared_from = 2
    store, names, prelude, label = _matmul_store(sched, k, bind, r, m_, n_)
    batches = int(np.prod(batch_shape, dtype=np.int64))

    def quad(op, at):  # 4 values from vec4 index `at` (f16 weights: 4 values per vec2<u32>)
        return bind.element4(base_of(g, n.inputs["ab".index(op)]), op, at)
    vec4 = [None, None]
    if sam == 1 and m_ % 4 == 0 and k_ > 0:
        vec4[0] = ("group", offsets[0] + f"\n    return {quad('a', f'(off + m + k * {sak}u) / 4u')};")
    elif sak == 1 and k_ % 4 == 0:
        vec4[0] = ("k", offsets[0] + f"\n    return {quad('a', f'(off + m * {sam}u + k) / 4u')};")
    if sbn == 1 and n_ % 4 == 0 and k_ > 0:
        vec4[1] = ("group", offsets[1] + f"\n    return {quad('b', f'(off + k * {sbk}u + n) / 4u')};")
    elif sbk == 1 and k_ % 4 == 0:
        vec4[1] = ("k", offsets[1] + f"\n    return {quad('b', f'(off + k + n * {sbn}u) / 4u')};")
    codes = igemm(bind, m_, n_, k_, batches, *loads, store, label, names, prelude,
                  k_contiguous=(sak == 1, sbk == 1), vec4=tuple(vec4))
    return codes


"""GEMM-shaped kernels: matmul and the implicit-GEMM tiles convolutions share (igemm*.wgsl).

The tile plan comes from the shape (`gemm_plan`, tuned on the GPU with bench/gemm_policy.py);
the loads stage each operand along its contiguous dimension, 16 bytes at a time where it is
aligned; elementwise chains may run in the loads (prologues) and in the store (epilogues).
"""
from __future__ import annotations

import numpy as np

from .codegen import (
    MAX_GROUPS,
    WG,
    KernelCode,
    _Bindings,
    _chain,
    _strides,
    _temp_ids,
    as_vec4,
    ew_code,
    grid,
    per_output,
    tile_type,
)
from ..runtime.package import QUICK
from .gemm_plan import GEMM_PLAN
from .gemm_store import store4_body
from .schedule import Kernel, Schedule, base_of
from .wgsl import render, template


def _inner(tg: int, tiles_2d: bool = False) -> str:
    """igemm.wgsl's unrolled K step for TG x TG threads."""
    def at(op, kk, t):
        return f"{op}_tile[{kk}u][{t}]" if tiles_2d else f"{op}_tile[{kk * tg}u + {t}]"
    return "\n".join(
        f"        let a{kk} = {at('a', kk, 'ty')};\n        let b{kk} = {at('b', kk, 'tx')};\n"
        + "\n".join(f"        acc{r} = acc{r} + a{kk}.{c} * b{kk};" for r, c in enumerate("xyzw"))
        for kk in range(16))


INNER = {(tg, two): _inner(tg, two) for tg in (8, 16) for two in (False, True)}


def thread_xy(tg: int, warp_rows: int) -> str:
    """WGSL for the thread's column and row (tx, ty) among TG x TG: a warp of 32 covers
    32 / warp_rows columns and warp_rows rows of threads (2: TG = 16 across, as
    local_invocation_id lays them out; 4: 8 x 4, so that a warp's workgroup-memory reads of
    B touch 8 entries, one 128-byte pass, instead of 16)."""
    across = min(tg, 32 // warp_rows)
    # (a warp's threads must tile the workgroup exactly, or two threads would own one output)
    assert 32 % warp_rows == 0 and tg % across == 0 and 32 // across <= tg, (tg, warp_rows)
    if across == tg:
        return "    let tx = lid.x;\n    let ty = lid.y;"
    return (f"    let tx = (tid / 32u) % {tg // across}u * {across}u + tid % {across}u;\n"
            f"    let ty = tid / 32u / {tg // across}u * {32 // across}u + tid % 32u / {across}u;")


def _halves128(op: str, spread: bool, tg: int = 16) -> tuple:
    """Tile entries of a thread's two groups of 4 rows (A) or columns (B): side by side
    (8 in a row), or TG groups apart (`spread`: neighbouring threads read neighbouring 16-byte
    entries, one pass through workgroup memory per 8 threads instead of two)."""
    t = "ty" if op == "a" else "tx"
    return (f"{t}", f"{tg}u + {t}") if spread else (f"{t} * 2u", f"{t} * 2u + 1u")


def _group_index(op: str, group: str, tg: int) -> str:
    """A 2D 128-tile row's index for `group`: [group], or the two indices of a [2][TG] (spread)
    or [TG][2] row (GEMM_PLAN["split_groups"]: each inner-loop read then indexes by the thread's
    own coordinate and a constant, one clamp for wgpu's checks instead of one per half)."""
    if not _groups_split():
        return f"[{group}]"
    wrap = "2u" if not GEMM_PLAN[f"spread_{op}"] else f"{tg}u"
    return f"[({group}) / {wrap}][({group}) % {wrap}]"


def _k_at(op: str, kk: int, quads: tuple) -> str:
    """A tile's K index: `kk`, or [kk / 4][kk % 4] where operand `op` is staged 4 k at a time
    and its K rows are split so (GEMM_PLAN["split_k_quads"]: its 4 stores per step then share
    one clamped address, the quad's, and differ by constants)."""
    return f"{kk // 4}u][{kk % 4}u" if op in quads else f"{kk}u"


def _inner128(bk: int, tg: int = 16, quads: tuple = ()) -> str:
    """igemm128.wgsl's unrolled K step: BK rows of the tiles, 64 multiply-adds each."""
    (al, ah), (bl, bh) = _halves128("a", GEMM_PLAN["spread_a"], tg), _halves128("b", GEMM_PLAN["spread_b"], tg)
    w = 2 * tg  # groups of 4 in a tile row

    def at(op, kk, group):
        if _groups_split():  # the half (l / h) a constant index beside the thread's coordinate
            t, half = ("ty" if op == "a" else "tx"), ("1u" if group in (ah, bh) else "0u")
            k = _k_at(op, kk, quads)
            return f"{op}_tile[BUF{k}][{half}][{t}]" if GEMM_PLAN[f"spread_{op}"] else f"{op}_tile[BUF{k}][{t}][{half}]"
        return f"{op}_tile[BUF{kk}u][{group}]" if GEMM_PLAN["tiles_2d"] else f"{op}_tile[BUF{kk * w}u + {group}]"
    return "\n".join(
        f"        let a{kk}l = {at('a', kk, al)};\n        let a{kk}h = {at('a', kk, ah)};\n"
        f"        let b{kk}l = {at('b', kk, bl)};\n        let b{kk}h = {at('b', kk, bh)};\n"
        + "\n".join(f"        acc{r}l = acc{r}l + a{kk}{'l' if r < 4 else 'h'}.{'xyzw'[r % 4]} * b{kk}l;\n"
                    f"        acc{r}h = acc{r}h + a{kk}{'l' if r < 4 else 'h'}.{'xyzw'[r % 4]} * b{kk}h;" for r in range(8))
        for kk in range(bk))


def _stores128(tg: int = 16) -> dict:
    """igemm128.wgsl's result stores: row r of the 8 (A's groups), columns of B's groups."""
    sa, sb = GEMM_PLAN["spread_a"], GEMM_PLAN["spread_b"]
    stores = "\n".join(
        f"    store4(g, slice, r + {r % 4 + (4 * tg if sa else 4) * (r >= 4)}u, "
        f"c + {(4 * tg if sb else 4) * (h == 'h')}u, acc{r}{h});" for r in range(8) for h in "lh")
    return {"STORES": stores, "ROW_STEP": 4 if sa else 8, "COL_STEP": 4 if sb else 8}


def _stage128(bk: int, k_contiguous, vec4=(None, None), tg: int = 16, steps: int = 1) -> dict:
    """igemm128.wgsl's staging: 2 TG BK / TG^2 vec4s of A and of B per thread (BK/8 on
    128-tiles, BK/4 on 64-tiles), loaded into registers
    (the next tile's while this one is multiplied, with GEMM_PLAN["prefetch"]) and stored
    into the tiles after the barrier. `vec4[i]`: operand i is read 16 bytes at a time
    through load_a4 / load_b4, along its rows or columns ("group": the 4 values a tile
    entry holds) or along K ("k": 4 entries' same component, stored one by one)."""
    index, load, store, out = [], [], [], {}
    w, nt = 2 * tg, tg * tg  # groups of 4 in a tile row; threads
    k_quads = tuple(op for op, mode in zip("ab", vec4) if mode == "k" and _groups_split() and GEMM_PLAN["split_k_quads"])
    per = w * bk // nt  # vec4s of each operand a thread stages per K step
    for op, contiguous, mode in zip("ab", k_contiguous, vec4):
        if mode == "k":
            out[f"{op.upper()}_ORDER"] = "4 k of one row at a time"
            quads = bk // 4
            for j in range(per):
                e = f"(tid + {nt * j}u)"
                if GEMM_PLAN["k_rows_fastest"]:  # a warp: 32 rows' same 4 k (32 banks when stored)
                    index.append(f"    let {op}q{j} = {e} / {8 * tg}u;\n    let {op}r{j} = {e} % {8 * tg}u;")
                else:  # a warp: 8 rows' 16 k (64 contiguous bytes each)
                    index.append(f"    let {op}q{j} = {e} % {quads}u;\n    let {op}r{j} = {e} / {quads}u;")
                at = (f"row0 + ar{j}, KB + aq{j} * 4u" if op == "a" else f"KB + bq{j} * 4u, col0 + br{j}")
                load.append(f"p{op}{j} = load_{op}4(g, {at});")

                def entry(c, op=op, j=j):  # k = q * 4 + c of row r
                    if not GEMM_PLAN["tiles_2d"]:
                        return f"{op}_tile[BUF({op}q{j} * 4u + {c}u) * {w}u + {op}r{j} / 4u]"
                    k = f"{op}q{j}][{c}u" if op in k_quads else f"{op}q{j} * 4u + {c}u"
                    return f"{op}_tile[BUF{k}]{_group_index(op, f'{op}r{j} / 4u', tg)}"
                store.append("\n".join(f"        {entry(c)}[{op}r{j} % 4u] = "
                                       f"p{op}{j}.{comp};" for c, comp in enumerate("xyzw")))
            continue
        st = _staging(contiguous and mode is None, "e", bk, w)
        out[f"{op.upper()}_ORDER"] = st["ORDER"]
        for j in range(per):
            e = f"(tid + {nt * j}u)"
            index.append(f"    let {op}k{j} = {st['K'].replace('e', e, 1)};\n    let {op}g{j} = {st['G'].replace('e', e, 1)};")
            if mode == "group":
                at = f"row0 + ag{j} * 4u, KB + ak{j}" if op == "a" else f"KB + bk{j}, col0 + bg{j} * 4u"
                load.append(f"p{op}{j} = load_{op}4(g, {at});")
            elif op == "a":
                els = ", ".join(f"load_a(g, row0 + ag{j} * 4u + {i}u, KB + ak{j})" for i in range(4))
                load.append(f"p{op}{j} = vec4<f32>({els});")
            else:
                els = ", ".join(f"load_b(g, KB + bk{j}, col0 + bg{j} * 4u + {i}u)" for i in range(4))
                load.append(f"p{op}{j} = vec4<f32>({els});")
            store.append(f"        {op}_tile[BUF{op}k{j}]{_group_index(op, f'{op}g{j}', tg)} = p{op}{j};" if GEMM_PLAN["tiles_2d"] else
                         f"        {op}_tile[BUF{op}k{j} * {w}u + {op}g{j}] = p{op}{j};")
    decl = "\n".join(f"    var {line.replace('KB', 'k0')}" for line in load)
    if GEMM_PLAN["prefetch"]:
        nxt = "\n".join(["        if (k0 + BK < k_end) {  // the next tile's loads run while this one is multiplied"]
                        + [f"            {line.replace('KB', '(k0 + BK)')}" for line in load] + ["        }"])
        first, store_tiles = decl, "\n".join(store)
        note = "the next tile's global loads are issued before this tile's multiply-adds."
    else:
        nxt, first = "", "\n".join(f"    var {line.split(' = ')[0]}: vec4<f32>;" for line in load)
        store_tiles = "\n".join([f"        {line.replace('KB', 'k0')}" for line in load] + store)
        note = "each tile is loaded, then multiplied."
    inner = _inner128(bk, tg, k_quads)
    if GEMM_PLAN["double_buffer"] and GEMM_PLAN["prefetch"]:
        # two tile buffers: the next tile is stored into one while the other is multiplied, so one
        # barrier per K step instead of two
        # (2D tiles: [buffer][k][group], so that the checks clamp the buffer once per step)
        note += " Two tile buffers, one barrier per K step."
        two = GEMM_PLAN["tiles_2d"]
        buffers, k_rows = "two buffers", 2 * bk
        if steps % 2 == 0:  # a trip's steps alternate the buffers: each named by a constant (no clamp)
            def buffer(b):
                return f"{b}u][" if two else f"{b * w * bk}u + "

            def step(cur):
                return "\n".join([nxt, inner.replace("BUF", buffer(cur)), "        if (k0 + BK < k_end) {",
                                  store_tiles.replace("BUF", buffer(1 - cur)), "        }", "        workgroupBarrier();"])
            steps_bodies = [step(i % 2) for i in range(steps)]
            before = [store_tiles.replace("BUF", buffer(0)), "    workgroupBarrier();"]
            note += " The buffers alternate by the steps of a loop trip."
        else:  # the buffer a variable, flipped every step
            buf, flip = ("buf][", "        buf = 1u - buf;") if two else ("buf + ", "        buf = STAGED - buf;")
            steps_bodies = ["\n".join([nxt, inner.replace("BUF", buf), flip, "        if (k0 + BK < k_end) {",
                                       store_tiles.replace("BUF", buf), "        }", "        workgroupBarrier();"])] * steps
            before = ["    var buf = 0u;", store_tiles.replace("BUF", "0u][" if two else ""), "    workgroupBarrier();"]
    else:
        steps_bodies = ["\n".join([store_tiles.replace("BUF", ""), "        workgroupBarrier();", nxt,
                                   inner.replace("BUF", ""), "        workgroupBarrier();"])] * steps
        before, buffers, k_rows = [], "one buffer", bk
    loop, trips = _trips(steps_bodies, "BK")
    return dict(INDEX="\n".join(index), LOAD_FIRST=first, BEFORE_LOOP="\n".join(before), LOOP_BODY=loop,
                STEPS_NOTE=trips, STAGED=w * bk, BUFFERS=buffers, BK=bk,
                A_TILE_TYPE=_tile128(k_rows, w, buffers, "a", k_quads), B_TILE_TYPE=_tile128(k_rows, w, buffers, "b", k_quads),
                PREFETCH_NOTE=note, TG=tg, TILE=8 * tg, GROUPS=w, **out)


def _groups_split() -> bool:
    return GEMM_PLAN["tiles_2d"] and GEMM_PLAN["split_groups"]


def _tile128(k_rows: int, w: int, buffers: str, op: str, quads: tuple = ()) -> str:
    """igemm128.wgsl's tile type for operand `op`: [k][group], or [k][half][thread] /
    [k][thread][half] (split_groups: the same bytes), with k as [k / 4][k % 4] for `quads`;
    two buffers of them are [buffer][k]..."""
    if _groups_split():
        row = tile_type(2, w // 2, True) if GEMM_PLAN[f"spread_{op}"] else tile_type(w // 2, 2, True)
        rows = k_rows // (2 if buffers == "two buffers" else 1)
        one = f"array<array<{row}, 4>, {rows // 4}>" if op in quads else f"array<{row}, {rows}>"
        return f"array<{one}, 2>" if buffers == "two buffers" else one
    if GEMM_PLAN["tiles_2d"] and buffers == "two buffers":
        return f"array<{tile_type(k_rows // 2, w, True)}, 2>"
    return tile_type(k_rows, w, GEMM_PLAN["tiles_2d"])


ACC128 = "\n".join(f"    var acc{r}{h} = vec4<f32>(0.0);" for r in range(8) for h in "lh")


def _trips(bodies: list, step: str) -> tuple:
    """A K loop's body doing one K step per entry of `bodies` per trip (each a block of its
    own: the steps' names repeat), and the kernel comment saying so."""
    if len(bodies) == 1:
        return bodies[0], ""
    blocks = [f"        {{\n{body}\n        }}" for body in bodies]
    return f"\n        k0 = k0 + {step};\n".join(blocks), f" {len(bodies)} K steps per loop trip."


def k_steps_per_trip(k: int, ks: int, bk: int, want: int) -> int:
    """`want` where every split-K slice's K steps divide by it (ks and k by want * bk), else 1."""
    return want if want > 1 and k % (want * bk) == 0 and ks % (want * bk) == 0 else 1


def _steps128(k: int, ks: int, bk: int) -> int:
    """K steps per loop trip on 128-tiles: more where the slices are long (GEMM_PLAN long_k)."""
    if ks >= GEMM_PLAN["long_k"]:
        steps = k_steps_per_trip(k, ks, bk, GEMM_PLAN["k_unroll_long"])
        if steps > 1:
            return steps
    return k_steps_per_trip(k, ks, bk, GEMM_PLAN["k_unroll"])


def gemm_plan(m: int, n: int, k: int, groups: int, conv: bool = False) -> tuple:
    """(tile, K step, split-K slices) for an M x N x K GEMM repeated `groups` times (`conv`:
    an implicit GEMM whose loads compute im2col windows)."""
    def tiles(t):
        return -(-m // t) * -(-n // t) * groups

    fill = GEMM_PLAN["fill"]
    # large tiles only when they still fill the GPU (and, with big_min_side, when M and N fill them)
    big_bk = GEMM_PLAN["big_bk_conv" if conv else "big_bk"]
    if tiles(128) >= 256 and min(m, n) >= GEMM_PLAN["big_min_side"]:
        return 128, big_bk, 1
    if conv and GEMM_PLAN["big_split"] and min(m, n) >= max(128, GEMM_PLAN["big_min_side"]):
        split = min(GEMM_PLAN["big_split"], -(-fill // tiles(128)), k // (GEMM_PLAN["slice_min"] * 4))
        if split > 1:
            return 128, big_bk, split
    if tiles(64) >= fill:
        return 64, 16, 1
    short = k <= GEMM_PLAN["short_k"]
    tile = 32 if short else 64
    slice_min = GEMM_PLAN["slice_min_short" if short else "slice_min"]
    return tile, 16, max(1, min(64, -(-fill // tiles(tile)), k // slice_min))


def _staging(k_contiguous: bool, index: str, ks: int, groups: int) -> dict:
    """Which tile entry (k, group of 4) thread/entry `index` stages: k fastest when the operand
    is contiguous along K (row-major activations, [out, in] weights), so that neighbouring
    threads read neighbouring addresses; else the group fastest."""
    if k_contiguous and GEMM_PLAN["k_fastest_staging"]:
        return {"K": f"{index} % {ks}u", "G": f"{index} / {ks}u", "ORDER": "k fastest"}
    return {"K": f"{index} / {groups}u", "G": f"{index} % {groups}u", "ORDER": "rows/columns fastest"}


def _vec4_common(common, decls, contract, modes, vec4) -> str:
    """igemm_common with the vec4 operands' bindings retyped (as_vec4: array<vec4<f32>>, or
    array<vec2<u32>> for f16 weights), their scalar loaders stubbed out and load_a4 / load_b4 added."""
    if not any(modes):
        return common
    # (a convolution's operand A, its weight, lives in binding b: vec4 entries may name theirs)
    bound = [v[2] if v and len(v) > 2 else op for op, v in zip("ab", vec4)]
    decls4, contract4 = as_vec4(decls, [b for b, mode in zip(bound, modes) if mode]), dict(contract)
    for op, mode in zip("ab", modes):
        if mode:
            contract4[f"LOAD_{op.upper()}"] = f"    return 0.0;  // read through load_{op}4"
    return render("igemm_common", BINDINGS=decls4, **contract4) + "".join(
        _vec4_loader(op, v[1], contract[f"GUARD_COND_{op.upper()}"]) for op, mode, v in zip("ab", modes, vec4) if mode)


def _stage_small(tg: int, k_contiguous, modes) -> dict:
    """igemm.wgsl's staging: statements for tile entry `e` of A and of B (see _stage128), in a
    loop over the thread's entries, or (GEMM_PLAN["straight_staging"]) once per entry with e a
    constant offset from tid, so that the driver's compiler can move what an entry's rows and
    columns cost (a convolution's pixel coordinates) out of the K loop."""
    out = _stage_entry(tg, k_contiguous, modes)
    body = out.pop("STAGE_A") + "\n" + out.pop("STAGE_B")
    if GEMM_PLAN["straight_staging"]:
        assert 16 % tg == 0, tg  # (entries tid + j TG^2 cover 16 TG exactly: no bound to check)
        out["STAGING"] = "\n".join(f"        {{\n            let e = tid + {j * tg * tg}u;\n{body}\n        }}"
                                   for j in range(-(-16 * tg // (tg * tg))))
    else:
        out["STAGING"] = f"        for (var e = tid; e < 16u * TG; e = e + TG * TG) {{\n{body}\n        }}"
    return out


def _stage_entry(tg: int, k_contiguous, modes) -> dict:
    """igemm.wgsl's staging statements for tile entry `e` of A and of B."""
    def tile_at(op, k, g):
        return f"{op}_tile[{k}][{g}]" if GEMM_PLAN["tiles_2d"] else f"{op}_tile[{k} * TG + {g}]"
    out = {}
    for op, contiguous, mode in zip("ab", k_contiguous, modes):
        i = 8 * " "
        if mode == "k":  # entry e: row e / 4, k quad e % 4 (k_rows_fastest: row e % TILE, quad e / TILE)
            row, quad = ("e % (4u * TG)", "e / (4u * TG)") if GEMM_PLAN["k_rows_fastest"] else ("e / 4u", "e % 4u")
            at = f"row0 + r{op}, k0 + q{op} * 4u" if op == "a" else f"k0 + q{op} * 4u, col0 + r{op}"
            lines = [f"{i}    let q{op} = {quad};", f"{i}    let r{op} = {row};", f"{i}    let v{op} = load_{op}4(g, {at});"] + [
                (f"{i}    {op}_tile[q{op} * 4u + {c}u][r{op} / 4u][r{op} % 4u] = v{op}.{comp};" if GEMM_PLAN["tiles_2d"] else
                 f"{i}    {op}_tile[(q{op} * 4u + {c}u) * TG + r{op} / 4u][r{op} % 4u] = v{op}.{comp};")
                for c, comp in enumerate("xyzw")]
            out[f"{op.upper()}_ORDER"] = "4 k of one row at a time"
        else:
            st = _staging(contiguous and mode is None, "e", 16, tg)
            out[f"{op.upper()}_ORDER"] = st["ORDER"]
            lines = [f"{i}    let {op}k = {st['K']};", f"{i}    let {op}g = {st['G']};"]
            if mode == "group":
                at = "row0 + ag * 4u, k0 + ak" if op == "a" else "k0 + bk, col0 + bg * 4u"
                lines.append(f"{i}    {tile_at(op, op + 'k', op + 'g')} = load_{op}4(g, {at});")
            elif op == "a":
                lines.append(f"{i}    {tile_at('a', 'ak', 'ag')} = vec4<f32>(" + ", ".join(
                    f"load_a(g, row0 + ag * 4u + {c}u, k0 + ak)" for c in range(4)) + ");")
            else:
                lines.append(f"{i}    {tile_at('b', 'bk', 'bg')} = vec4<f32>(" + ", ".join(
                    f"load_b(g, k0 + bk, col0 + bg * 4u + {c}u)" for c in range(4)) + ");")
        out[f"STAGE_{op.upper()}"] = "\n".join(lines)
    return out


def _vec4_loader(op: str, body: str, guard: str) -> str:
    args = "m: u32, k: u32" if op == "a" else "k: u32, n: u32"
    check = f"    if ({guard}) {{\n        return vec4<f32>(0.0);\n    }}\n" if guard else ""
    return f"\n\nfn load_{op}4(g: u32, {args}) -> vec4<f32> {{\n{check}{body}\n}}\n"


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


def igemm(bind: _Bindings, m: int, n: int, k: int, groups: int, load_a: str, load_b: str, store: str,
          label: str, names=("a", "b", "c"), prelude: str = "", k_contiguous=(False, False), vec4=(None, None),
          conv: bool = False, n_load: int = 2, load_prelude: bool = False):
    """Implicit-GEMM kernel(s) from WGSL bodies of load_a(g, m, k), load_b(g, k, n) and
    store(g, m, n, v). Returns one KernelCode, or two with split-K (partials + sum).
    The first `n_load` bindings belong to the loads (A and B, or what prologues computing
    them read), the others to store() (the output, and an epilogue's inputs).
    `k_contiguous`: whether A and B are laid out along K in memory (how to stage them).
    `vec4`: per operand None, or (mode, body of load_a4(g, m, k) / load_b4(g, k, n) -> vec4,
    reading its binding as as_vec4 retypes it (bind.element4)[, that binding's name when not
    the operand's]),
    used by every tile size (see _stage128, _stage_small).
    `conv`: the loads compute im2col windows (the plan steps K differently)."""
    tile, bk, split = gemm_plan(m, n, k, groups, conv)
    # 8x8 outputs per thread: 128-tiles, and 64-tiles too with GEMM_PLAN["regs64"]
    big = tile == 128 or (tile == 64 and GEMM_PLAN["regs64"])
    if big and GEMM_PLAN["double_buffer"] and GEMM_PLAN["prefetch"]:
        bk = 8
    tg = tile // 8 if big else tile // 4
    ks = -(-(-(-k // split)) // bk) * bk  # slice length, a multiple of the K step
    split = -(-k // ks)
    # with split-K, the GEMM kernel writes [slice, g, m, n] partials into a temp buffer
    st = store if split == 1 else f"    partial[((slice * {groups}u + g) * {m}u + m) * {n}u + n] = v;"
    contract = dict(M=m, N=n, K=k, SPLIT=split, KS=ks, LOAD_A=load_a, LOAD_B=load_b, STORE=st,
                    STORE4=store4_body(st, n, GEMM_PLAN["store4"]))
    # the GPU kernels' tiles step M and N by `tile` and K by `bk` from 0 (slices: multiples of
    # bk): a dimension they divide never runs past its edge
    gpu_contract = {**contract, **edge_guards({"m": m % tile != 0, "n": n % tile != 0, "k": k % bk != 0})}
    contract.update(ALL_GUARDED)  # (the CPU variant's own loops)
    all_decls = bind.decls(list(names), loaders=False).splitlines()
    loaders = bind.loaders(list(names), range(n_load))  # f16 operands widened as they load
    if split == 1:
        decls, slots = prelude + "\n".join(all_decls) + loaders, bind.list()
    else:
        temp = ("temp", next(_temp_ids))
        slots = bind.list()[:n_load] + [(temp, "read_write")]
        decls = (prelude if load_prelude else "") + "\n".join(all_decls[:n_load]) + \
            f"\n@group(0) @binding({n_load}) var<storage, read_write> partial: array<f32>;" + loaders
    common = render("igemm_common", BINDINGS=decls, **contract)
    gpu_common = render("igemm_common", BINDINGS=decls, **gpu_contract)
    if big:
        modes = [v[0] if v and GEMM_PLAN["vec4_loads"] else None for v in vec4]
        stage = _stage128(bk, k_contiguous, modes, tg, _steps128(k, ks, bk))
        wgsl = render("igemm128", COMMON=_vec4_common(gpu_common, decls, gpu_contract, modes, vec4), ACC_DECL=ACC128,
                      THREAD_XY=thread_xy(tg, GEMM_PLAN["warp_rows"]), **_stores128(tg), **stage)
    else:
        assert bk == 16, bk  # igemm.wgsl steps K by 16: the edge guards above assume the plan's K step
        modes = [v[0] if v and GEMM_PLAN["vec4_loads"] and GEMM_PLAN["vec4_small_tiles"] else None for v in vec4]
        stage = _stage_small(tile // 4, k_contiguous, modes)
        step = "\n".join([stage.pop("STAGING"), "        workgroupBarrier();", INNER[tile // 4, GEMM_PLAN["tiles_2d"]],
                          "        workgroupBarrier();"])
        body, note = _trips([step] * k_steps_per_trip(k, ks, bk, GEMM_PLAN["k_unroll_small"]), "16u")
        wgsl = render("igemm", COMMON=_vec4_common(gpu_common, decls, gpu_contract, modes, vec4),
                      LOOP_BODY=body, STEPS_NOTE=note, TG=tile // 4,
                      TILE_TYPE=tile_type(16, tile // 4, GEMM_PLAN["tiles_2d"]),
                      THREAD_XY=thread_xy(tile // 4, GEMM_PLAN["warp_rows_small"]), **stage)
    threads = (tg, tg, 1)
    code = KernelCode(wgsl, threads, slots, (-(-n // tile), -(-m // tile), groups * split), label)
    code.gemm_decls, code.gemm_store = decls, st  # for variants with other main loops
    # CPU rasterisers: same bindings and split, a barrier-free kernel with its own grid
    cpu = render("igemm_cpu", COMMON=common)
    code.variants = {"cpu": (cpu, (8, 8, 1), (-(-n // 32), -(-m // 32), groups * split))}
    # the quick tier (Session(quick_start=True)): a kernel fast to compile, until this one has;
    # none where its 16-tiles need more workgroups than a device allows (the tuned kernel runs)
    quick_groups = (-(-n // 16), -(-m // 16), groups * split)
    if max(quick_groups) <= MAX_GROUPS:
        code.variants[QUICK] = (render("igemm_quick", COMMON=common), (16, 16, 1), quick_groups)
    if split == 1:
        return code
    code.temps = {temp: split * groups * m * n * 4}
    total = groups * m * n
    body = "\n".join([
        f"    let g = idx / {m * n}u;", f"    let m = (idx / {n}u) % {m}u;", f"    let n = idx % {n}u;",
        "    var v = 0.0;",
        f"    for (var s = 0u; s < {split}u; s++) {{ v += partial[s * {total}u + idx]; }}",
        store.replace("    ", "    ", 1)])
    # the sum kernel runs store(): it binds what store() reads and writes, after the partials
    decls2 = "\n".join(["@group(0) @binding(0) var<storage, read> partial: array<f32>;"] + [
        line.replace(f"@binding({i + n_load})", f"@binding({i + 1})") for i, line in enumerate(all_decls[n_load:])])
    wgsl2 = per_output(decls2, total, body.replace("    let idx = g *", "    let _i = g *"), prelude)
    reduce = KernelCode(wgsl2, (WG, 1, 1), [(temp, "read")] + bind.list()[n_load:], grid(-(-total // WG)),
                        label + "/splitk-sum")
    return [code, reduce]


def prologue_load(sched: Schedule, k: Kernel, x: int, at: str, bind: _Bindings):
    """When the GEMM-like kernel `k` computes its input `x` in its loads (see
    schedule._gemm_prologue): (WGSL returning x's element at flat index `at`, whether the
    prelude's helpers are used); else None."""
    if x not in k.members or x in k.roots or x == k.product:
        return None
    values = {}
    coords, body, uses_prelude = ew_code(sched, _chain(sched.graph, x, k.members), [], bind, names=values)
    return "\n".join([f"    let idx = {at};"] + coords + body + [f"    return f32({values[x]});"]), uses_prelude


def load_operand(sched: Schedule, k: Kernel, bind: _Bindings, names: dict, x: int, name: str, at: str):
    """(WGSL returning operand `x`'s element at flat index `at`, whether it uses the prelude):
    read from a binding of its own, recorded as `name` in `names` (slot -> name), or computed
    by a prologue when the kernel holds its chain (see prologue_load)."""
    prologue = prologue_load(sched, k, x, at, bind)
    if prologue is not None:
        return prologue
    names[len(bind.slots)] = name
    bind.use(x, own=True)
    return f"    return {bind.element(x, name, at)};", False


def _batch_offset(batch_shape, src_shape, var):
    """WGSL for the element offset of batch `g` within an operand with (broadcast) batch dims."""
    terms = []
    bst = _strides(batch_shape)
    lead = len(batch_shape) - (len(src_shape) - 2)
    sst = _strides(src_shape)
    for d in range(len(batch_shape)):
        if batch_shape[d] == 1 or d < lead or src_shape[d - lead] == 1:
            continue
        terms.append(f"((g / {bst[d]}u) % {batch_shape[d]}u) * {sst[d - lead]}u")
    return f"    let {var} = {' + '.join(terms) if terms else '0u'};"


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
    bind = _Bindings(g, sched.storage)
    names, load_prelude = {}, False
    loads, offsets = [], []
    for op, i, (s_row, s_col) in (("a", n.inputs[0], ("m", "k")), ("b", n.inputs[1], ("k", "n"))):
        x = base_of(g, i)
        strides = (sam, sak) if op == "a" else (sbk, sbn)
        at = f"off + {s_row} * {strides[0]}u + {s_col} * {strides[1]}u"
        offset = _batch_offset(batch_shape, g.nodes[i].shape, "off")
        offsets.append(offset)
        code, uses_prelude = load_operand(sched, k, bind, names, x, op, at)
        loads.append(offset + "\n" + code)
        load_prelude |= uses_prelude
    load_a, load_b = loads
    n_load = len(bind.slots)
    bind.shared_from = n_load
    label = "matmul" if n_load == 2 and set(names.values()) == {"a", "b"} else "matmul(prologue)"
    if k.epilogue:  # elementwise consumers computed in store(): the product never touches memory
        coords, body, uses_prelude = ew_code(sched, k.epilogue, k.roots, bind, given={r: "v"})
        store = "\n".join([f"    let idx = g * {m_ * n_}u + m * {n_}u + n;"] + coords + body)
        label += "+" + "+".join(sorted({g.nodes[e].op for e in k.epilogue}))
    else:
        uses_prelude = False
        names[len(bind.slots)] = "c"
        bind.use(r, write=True, own=True)
        store = f"    c[g * {m_ * n_}u + m * {n_}u + n] = v;"
    names = [names.get(j, f"t{j}") for j in range(len(bind.slots))]
    prelude = template("prelude") + "\n" if uses_prelude or load_prelude else ""
    plain = names[:2] == ["a", "b"]
    batches = int(np.prod(batch_shape, dtype=np.int64))
    # 16-byte loads where a tile entry's 4 values (or 4 consecutive k) are contiguous and
    # aligned: every row and batch offset is then a multiple of 4
    vec4 = [None, None]
    off_a, off_b = offsets
    half = [bind.half(base_of(g, i)) for i in n.inputs]  # f16 weights: 4 values per vec2<u32>

    def quad(op, at):
        return bind.element4(base_of(g, n.inputs["ab".index(op)]), op, at)
    if "a" not in names:
        pass  # computed by a prologue: nothing to read 16 bytes at a time
    elif sam == 1 and m_ % 4 == 0 and k_ > 0:
        vec4[0] = ("group", off_a + f"\n    return {quad('a', f'(off + m + k * {sak}u) / 4u')};")
    elif sak == 1 and k_ % 4 == 0:
        vec4[0] = ("k", off_a + f"\n    return {quad('a', f'(off + m * {sam}u + k) / 4u')};")
    if "b" not in names:
        pass
    elif sbn == 1 and n_ % 4 == 0 and k_ > 0:
        vec4[1] = ("group", off_b + f"\n    return {quad('b', f'(off + k * {sbk}u + n) / 4u')};")
    elif sbk == 1 and k_ % 4 == 0:
        vec4[1] = ("k", off_b + f"\n    return {quad('b', f'(off + k + n * {sbn}u) / 4u')};")
    codes = igemm(bind, m_, n_, k_, batches, load_a, load_b, store, label, names, prelude,
                  k_contiguous=(sak == 1, sbk == 1), vec4=tuple(vec4), n_load=n_load, load_prelude=load_prelude)
    # both along K in memory: the CPU's dot-product kernel (f32 operands only: f16 weights take
    # igemm_cpu, whose speed on CPU rasterisers with them is not measured)
    if plain and sak == 1 and sbk == 1 and k_ % 4 == 0 and not any(half):
        first = codes[0] if isinstance(codes, list) else codes
        decls = as_vec4(first.gemm_decls, "ab")
        split, ks = _split_of(first.wgsl)
        st = first.gemm_store
        offsets = (_batch_offset(batch_shape, a.shape, "a_el") + "\n" + _batch_offset(batch_shape, b.shape, "b_el")
                   + "\n    let a_off = a_el / 4u;\n    let b_off = b_el / 4u;")
        wgsl = render("mm_dot_cpu", BINDINGS=decls, M=m_, N=n_, K=k_, SPLIT=split, KS=ks, STORE=st, OFFSETS=offsets)
        first.variants = {**first.variants, "cpu": (wgsl, (8, 8, 1), (-(-n_ // 32), -(-m_ // 32), batches * split))}
    return codes


def _split_of(wgsl: str) -> tuple:
    import re

    split = int(re.search(r"const SPLIT: u32 = (\d+)u;", wgsl).group(1))
    ks = int(re.search(r"const KS: u32 = (\d+)u;", wgsl).group(1))
    return split, ks

"""WGSL for attention: the fused forward (kernels/attention.wgsl) and FlashAttention-2's
backward (kernels/attention_dq.wgsl, kernels/attention_dkv.wgsl), reading q, k, v through
strides so that head transposes need no copies."""
from __future__ import annotations

from ..runtime.package import QUICK
from .codegen import WG, KernelCode, _Bindings, _strides, _temp_ids, as_vec4, grid, per_output, tile_type
from .lift_sizes import LOOPED
from .schedule import Kernel, Schedule, base_of
from .wgsl import render


def _bind_strided(sched: Schedule, bind: _Bindings, i: int) -> tuple:
    """Binds input `i` to a slot of its own and returns its (batch, head, token) strides;
    a head transpose in front of it (a schedule view) is read in place: [b, t, h, d] strides,
    permuted."""
    g = sched.graph
    if i in sched.views:
        st = _strides(g.nodes[g.nodes[i].inputs[0]].shape)
        bind.use(sched.views[i], own=True)
        return st[0], st[2], st[1]
    if i in sched.written:  # an attention output its kernel wrote in [b, t, h, d] layout
        st = _strides(g.nodes[sched.written[i]].shape)
        bind.use(i, own=True)
        return st[0], st[2], st[1]
    st = _strides(g.nodes[i].shape)
    bind.use(base_of(g, i), own=True)
    return st[0], st[1], st[2]


# attention splits its keys into ranges of at least `min_split_keys` (H200: 257 tokens 61.9 us
# with 128, 40.7 with 32) until about `fill` workgroups run, when there are at least `min_keys`
# (bench/gemm_policy.py on the H200: SmolVLA's 163 keys 57 -> 32 us; 1,500 tokens 364 us at
# 256 workgroups, 301 at 1,024, but the partial softmaxes then took Whisper-tiny's training
# step from 267.6 to 277.0 MB, over PyTorch's 268.7: 512 keeps it at 267.9)
ATTENTION_PLAN = {"min_split_keys": 32, "fill": 512, "min_keys": 64,
                  # key and value tiles indexed [key][vec4], not key * DV4 + vec4: wgpu's bounds checks
                  # then clamp the key once per key, not each of its 2 x DV4 reads (see codegen_gemm's
                  # tiles_2d). H200, gemm_policy's four attentions: 495 us against 461 flat (1,500
                  # tokens 368 vs 342, SmolLM2's 4 x 128 58 vs 49; 257 and 163 keys 1 us faster): off
                  "tiles_2d": False}
# the forward kernel's key and value tiles take at most this much workgroup memory: tiles of 32
# keys up to 128-wide heads, fewer keys past that (SD-1.5's 160-wide heads: 25), so that devices
# allowing 32 KiB (lavapipe, Apple) run every model; 48 KiB devices would take 38
SHARED_BUDGET = 32768
# the quick tier's forward kernel keeps the head dimension in loops from this many vec4s (68-wide
# heads; 64-wide ones, DINOv2's and SmolLM2's, stay written out): written out, SD-1.5's 160-wide heads (40 vec4 accumulators a thread) took the driver
# 0.38 s to compile, its 80-wide 0.13 s, the longest of its first tier's 113 kernels
QUICK_LOOPS_FROM = 17


def attention(sched: Schedule, k: Kernel) -> KernelCode:
    """Fused attention (see kernels/attention.wgsl); a CPU-rasteriser variant reads keys and
    values straight from memory instead of staging them behind barriers. The kernel also
    writes each row's log-sum-exp when the graph holds an attention_lse sibling (training),
    and the gradient's siblings become the two backward kernels."""
    import math

    from .codegen import f32_literal

    g = sched.graph
    roots = {g.nodes[r].op: r for r in k.roots}
    if "attention_grad" in roots:
        return attention_backward(sched, k)
    r_out, r_lse = roots.get("attention"), roots.get("attention_lse")
    n = g.nodes[k.roots[0]]
    q, kk, v = (g.nodes[i] for i in n.inputs)
    b, h, s, d = q.shape
    hk, t = kk.shape[1], kk.shape[2]
    dv4 = d // 4
    scale = n.attr("scale")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    bind = _Bindings(g, sched.storage)
    (qsb, qsh, qst), (ksb, ksh, kst), (vsb, vsh, vst) = (_bind_strided(sched, bind, i) for i in n.inputs)
    names = ["q", "k", "v"] + (["out"] if r_out is not None else []) + (["lse"] if r_lse is not None else [])
    for r in (r_out, r_lse):
        if r is not None:
            bind.use(r, write=True, own=True)
    # few query blocks (one row per thread) cannot fill a GPU: split the keys across
    # workgroups and merge the partial softmaxes after (flash-decoding)
    blocks = -(-s // 64) * b * h
    fill = ATTENTION_PLAN["fill"]
    split = 1 if blocks >= fill or t < ATTENTION_PLAN["min_keys"] else max(1, min(16, -(-fill // blocks), t // ATTENTION_PLAN["min_split_keys"]))
    kl = -(-(-(-t // split)) // 32) * 32
    split = -(-t // kl)
    width = 4 * dv4 + 2
    if split == 1:
        decls = bind.decls(names)
        # the output in [b, s, h, d] layout when the head transpose after it is all that reads it
        row_of = "((b * S + row) * H + h)" if r_out in sched.written else "(bh * S + row)"
        store = ["        let inv = 1.0 / l;", f"        let o = {row_of} * DV4 * 4u;"]
        if r_out is not None:
            store += [f"        out[o + {4 * c}u] = acc{c}.x * inv; out[o + {4 * c + 1}u] = acc{c}.y * inv; "
                      f"out[o + {4 * c + 2}u] = acc{c}.z * inv; out[o + {4 * c + 3}u] = acc{c}.w * inv;"
                      for c in range(dv4)]
        if r_lse is not None:
            store.append("        lse[bh * S + row] = m + log(l);")
        store = "\n".join(store)
        slots = bind.list()
    else:
        temp = ("temp", next(_temp_ids))
        decls = "\n".join(bind.decls(names).splitlines()[:3]) + \
            "\n@group(0) @binding(3) var<storage, read_write> part: array<f32>;"
        store = (f"        let o = ((split * {b * h}u + bh) * S + row) * {width}u;\n        part[o] = m;\n"
                 "        part[o + 1u] = l;\n" + "\n".join(
                     f"        part[o + {2 + 4 * c}u] = acc{c}.x; part[o + {3 + 4 * c}u] = acc{c}.y; "
                     f"part[o + {4 + 4 * c}u] = acc{c}.z; part[o + {5 + 4 * c}u] = acc{c}.w;" for c in range(dv4)))
        slots = bind.list()[:3] + [(temp, "read_write")]
    q_load = "\n".join(f"    let q{c} = vec4<f32>(q[q_base + {4 * c}u], q[q_base + {4 * c + 1}u], "
                       f"q[q_base + {4 * c + 2}u], q[q_base + {4 * c + 3}u]);" for c in range(dv4))
    acc = "\n".join(f"    var acc{c} = vec4<f32>(0.0);" for c in range(dv4))
    common = dict(BINDINGS=decls, S=s, T=t, H=h, HK=hk, REP=h // hk, DV4=dv4, SCALE=f32_literal(scale), SPLIT=split, KL=kl,
                  QSB=qsb, QSH=qsh, QST=qst, KSB=ksb, KSH=ksh, KST=kst, VSB=vsb, VSH=vsh, VST=vst,
                  CAUSAL="true" if n.attr("causal") else "false", Q_LOAD=q_load, ACC_DECL=acc, STORE=store)

    tile = max(1, min(32, SHARED_BUDGET // (2 * 16 * dv4)))  # keys per staged tile: k and v, 16 bytes a vec4

    two = ATTENTION_PLAN["tiles_2d"]

    def body(shared: bool):
        def tile_at(name, c):
            return f"{name}[jj][{c}u]" if two else f"{name}[jj * {dv4}u + {c}u]"
        key = (lambda c: tile_at("k_tile", c)) if shared else (lambda c: f"k4(k_base, j, {c}u)")
        val = (lambda c: tile_at("v_tile", c)) if shared else (lambda c: f"v4(v_base, j, {c}u)")
        score = "            let s = (" + " + ".join(f"dot(q{c}, {key(c)})" for c in range(dv4)) + ") * SCALE;"
        update = "\n".join(f"                acc{c} = acc{c} * corr + p * {val(c)};" for c in range(dv4))
        stage = ""
        if shared:
            stage = "\n".join([
                f"        for (var i = lid; i < TILE * {dv4}u; i = i + 64u) {{",
                f"            let jj = i / {dv4}u;", f"            let c = i % {dv4}u;",
                "            let jk = min(j0 + jj, T - 1u);",
                f"            k_tile[{'jj][c' if two else 'i'}] = k4(k_base, jk, c);",
                f"            v_tile[{'jj][c' if two else 'i'}] = v4(v_base, jk, c);",
                "        }", "        workgroupBarrier();"])
        return dict(SCORE=score, ACC_UPDATE=update, STAGE=stage,
                    STAGE_END="        workgroupBarrier();" if shared else "",
                    SHARED="shared" if shared else "not shared",
                    TILE_TYPE=tile_type(tile, dv4, two) if shared else "array<vec4<f32>, 1>",
                    TILE=tile if shared else 32)

    wgsl = render("attention", **common, **body(True))
    groups = (-(-s // 64), b * h, split)
    code = KernelCode(wgsl, (64, 1, 1), slots, groups, "attention")
    code.variants = {"cpu": (render("attention", **common, **body(False)), (64, 1, 1), groups)}
    if dv4 >= QUICK_LOOPS_FROM:  # the quick tier: the head dimension in loops (see QUICK_LOOPS_FROM)
        looped = {**common, **body(True), **_looped_head(dv4, split, r_out is not None, r_lse is not None,
                                                          row_of if split == 1 else None, width, b * h, two)}
        code.variants[QUICK] = (render("attention", **looped), (64, 1, 1), groups)
    if split == 1:
        return code
    code.temps = {temp: split * b * h * s * width * 4}
    rows = b * h * s
    merge = "\n".join([  # a thread per output value: the merge must not starve the GPU either
        f"    let c = idx % {d}u;", f"    let bh = (idx / {d}u) / {s}u;", f"    let row = (idx / {d}u) % {s}u;",
        "    var mx = -3.4028235e38;",
        f"    for (var p = 0u; p < {split}u; p++) {{ mx = max(mx, part[((p * {b * h}u + bh) * {s}u + row) * {width}u]); }}",
        "    var l = 0.0;",
        "    var acc = 0.0;",
        f"    for (var p = 0u; p < {split}u; p++) {{",
        f"        let o = ((p * {b * h}u + bh) * {s}u + row) * {width}u;",
        "        let w = exp(part[o] - mx);",
        "        l += part[o + 1u] * w;",
        "        acc += part[o + 2u + c] * w;", "    }"]
        + ([f"    out[(((bh / {h}u) * {s}u + row) * {h}u + bh % {h}u) * {d}u + c] = acc / l;" if r_out in sched.written
            else "    out[idx] = acc / l;"] if r_out is not None else [])
        + ([f"    if (c == 0u) {{ lse[idx / {d}u] = mx + log(l); }}"] if r_lse is not None else []))
    mdecls = "\n".join(["@group(0) @binding(0) var<storage, read> part: array<f32>;"] + [
        f"@group(0) @binding({j + 1}) var<storage, read_write> {name}: array<f32>;"
        for j, name in enumerate(names[3:])])
    merged = KernelCode(per_output(mdecls, rows * d, merge), (WG, 1, 1),
                        [(temp, "read")] + bind.list()[3:], grid(-(-rows * d // WG)), "attention/merge")
    return [code, merged]


def _looped_head(dv4: int, split: int, out: bool, lse: bool, row_of: str | None, width: int, heads: int,
                 two: bool) -> dict:
    """The forward kernel's head-dimension code as loops over a private array of vec4s instead of
    DV4 written-out vec4 variables: much less for the driver to compile, and slower to run
    (the array lives in memory), so only the quick tier has it (see QUICK_LOOPS_FROM)."""
    at = (lambda name: f"{name}[jj][c]") if two else (lambda name: f"{name}[jj * {dv4}u + c]")
    each = "for (var c = 0u; c < DV4; c = c + 1u)"
    parts = {
        "Q_LOAD": f"    {LOOPED}\n    var qv: array<vec4<f32>, {dv4}>;\n    {each} {{\n        let o = q_base + 4u * c;\n"
                  "        qv[c] = vec4<f32>(q[o], q[o + 1u], q[o + 2u], q[o + 3u]);\n    }",
        "ACC_DECL": f"    var acc: array<vec4<f32>, {dv4}>;",
        "SCORE": f"            var qk = 0.0;\n            {each} {{ qk = qk + dot(qv[c], {at('k_tile')}); }}\n"
                 "            let s = qk * SCALE;",
        "ACC_UPDATE": f"                {each} {{ acc[c] = acc[c] * corr + p * {at('v_tile')}; }}"}
    if split == 1:
        store = ["        let inv = 1.0 / l;", f"        let o = {row_of} * DV4 * 4u;"]
        if out:
            store.append(f"        {each} {{\n            let a = acc[c] * inv;\n"
                         "            out[o + 4u * c] = a.x; out[o + 4u * c + 1u] = a.y; "
                         "out[o + 4u * c + 2u] = a.z; out[o + 4u * c + 3u] = a.w;\n        }")
        if lse:
            store.append("        lse[bh * S + row] = m + log(l);")
    else:
        store = [f"        let o = ((split * {heads}u + bh) * S + row) * {width}u;", "        part[o] = m;",
                 "        part[o + 1u] = l;",
                 f"        {each} {{\n            let a = acc[c];\n"
                 "            part[o + 2u + 4u * c] = a.x; part[o + 3u + 4u * c] = a.y; "
                 "part[o + 4u + 4u * c] = a.z; part[o + 5u + 4u * c] = a.w;\n        }"]
    return {**parts, "STORE": "\n".join(store)}


def _loader(fn: str, buf: str, vec4: bool = False) -> str:
    """fn(base, c): vec4 c of the row at element `base`; `vec4`: `buf` is bound as
    array<vec4<f32>> (rows of d % 4 == 0 elements start at multiples of 4: one 16-byte load)."""
    if vec4:
        return f"fn {fn}(base: u32, c: u32) -> vec4<f32> {{\n    return {buf}[base / 4u + c];\n}}"
    return (f"fn {fn}(base: u32, c: u32) -> vec4<f32> {{\n    let x = base + c * 4u;\n"
            f"    return vec4<f32>({buf}[x], {buf}[x + 1u], {buf}[x + 2u], {buf}[x + 3u]);\n}}")


# the backward kernels' plan: `vec4_loads` reads q, k, v, o and dO 16 bytes at a time (block
# sizes: ops_layers.backward_blocks, within ops_layers.BACKWARD_BUDGET)
# "fill": workgroups a backward kernel aims for; with fewer, its loop (over keys for dQ, over
# queries for dK and dV) is cut into chunks run by workgroups of their own, which write partial
# sums that a last pass adds up (0: never); "max_chunks" at most, each of >= "min_blocks" steps.
# H200 (bench/gemm_policy.py, forward included): Whisper-tiny's 1,500 tokens (282 workgroups a
# kernel) 2,068 -> 1,719 us a layer at 1,056 (528: 1,829; 2,112: 1,760 and +20 MB of partials),
# its step 14.85 -> 13.41 ms; SD-1.5's cross-attention (77 keys) 850 -> 385 us.
ATTENTION_BWD_PLAN = {"vec4_loads": False, "fill": 1056, "max_chunks": 8, "min_blocks": 4,
                      # workgroup tiles indexed [row][column], not row * stride + column: wgpu's bounds
                      # checks then clamp a row once per loop step, not every read (see codegen_gemm's
                      # tiles_2d). H200, gemm_policy's four backward cases 15.64 -> 15.25 ms (Whisper's
                      # 1,500 tokens 1729 -> 1699 us, SD-1.5's 4,096 13.40 -> 13.05 ms)
                      "tiles_2d": True,
                      # loops written out, one block per step (c: the score tile's vec4 columns, where a
                      # thread's share of the tile is at most "unroll_scores" entries; jj, ii: the dQ and
                      # dK/dV steps over a tile's keys / queries): wgpu's loop bounding keeps the driver from
                      # unrolling them, and a constant index needs no clamp. H200, gemm_policy's four cases
                      # 15.26 ms with loops, 13.73 with jj and ii written out (Whisper's 1,500 tokens 1683 ->
                      # 1511 us, SD-1.5's 4,096 13.07 -> 11.78 ms), c too: Whisper 1410 us but SD-1.5 13.32
                      # ms (its 8 x 8 threads hold 4 x 4 scores each: 16 vec4 reads a column step); with
                      # c only where a thread holds <= 4 scores, 13.64 ms. The threshold sits between the
                      # two measured shares, 2 and 16 scores; 8 (small heads, small blocks) is unmeasured
                      "unroll": ("c", "jj", "ii"), "unroll_scores": 4}


def _at(name: str, row: str, col: str, stride: str) -> str:
    """A backward kernel's workgroup-tile element (see ATTENTION_BWD_PLAN["tiles_2d"])."""
    return f"{name}[{row}][{col}]" if ATTENTION_BWD_PLAN["tiles_2d"] else f"{name}[{row} * {stride} + {col}]"


def _template_at() -> dict:
    """The backward templates' own tile reads: RC (row r, column c) and LID_C (row lid)."""
    two = ATTENTION_BWD_PLAN["tiles_2d"]
    return {"RC": "r][c" if two else "r * STR + c", "LID_C": "lid][c" if two else "lid * STR + c"}


def _steps(var: str, count: int, body: str, ind: str, unroll: bool | None = None) -> str:
    """WGSL running `body` for `var` = 0 .. count - 1: a block per step with `var` a constant
    (`unroll`; by default, `var` in ATTENTION_BWD_PLAN["unroll"]), or a loop."""
    written_out = var in ATTENTION_BWD_PLAN["unroll"] if unroll is None else unroll
    if written_out:
        return "\n".join(f"{ind}{{\n{ind}    let {var} = {i}u;\n{body}\n{ind}}}" for i in range(count))
    return f"{ind}for (var {var} = 0u; {var} < {count}u; {var} = {var} + 1u) {{\n{body}\n{ind}}}"


def _chunks(workgroups: int, blocks: int) -> tuple:
    """(chunks, blocks per chunk) of a backward kernel's loop of `blocks` steps."""
    plan = ATTENTION_BWD_PLAN
    fill = plan["fill"]
    c = max(1, min(plan["max_chunks"], -(-fill // workgroups), blocks // plan["min_blocks"])) if fill else 1
    per = -(-blocks // c)
    return -(-blocks // per), per


def _sum_partials(sched, parts, chunks, heads, rows, d, label):
    """The pass adding up `chunks` partial sums ([chunk, batch * heads, rows, d] each) into
    their outputs; parts: (temp key, output node) pairs."""
    bind = _Bindings(sched.graph, sched.storage)
    total = parts[0][2]
    body = [f"    let c = idx % {d}u;", f"    let row = (idx / {d}u) % {rows}u;", f"    let bh = idx / {rows * d}u;"]
    for part, out, _ in parts:
        src, dst = bind.use_key(part), bind.use(out, write=True)
        at = f"(((bh / {heads}u) * {rows}u + row) * {heads}u + bh % {heads}u) * {d}u + c" \
            if out in sched.written else "idx"
        body.append(f"    {dst}[{at}] = " + " + ".join(f"{src}[{z * total}u + idx]" for z in range(chunks)) + ";")
    return KernelCode(per_output(bind.decls(), total, "\n".join(body)), (WG, 1, 1), bind.list(),
                      grid(-(-total // WG)), label)


def _score_tile(rt: int, ct: int, tx: int, width: int, lse: str, delta: str, p_store: bool, ind: str, dv4: int) -> str:
    """WGSL for one tile step of both backward kernels: scores and dP = dO v^T for query rows
    ty * RT + r and key columns tx + TX c (separate variables, loops unrolled here: private
    arrays indexed in loops are slow on NVIDIA), then P and dS into workgroup memory."""
    rc = [(r, c) for r in range(rt) for c in range(ct)]
    out = [f"{ind}var s{r}_{c} = 0.0;\n{ind}var dp{r}_{c} = 0.0;" for r, c in rc]
    step = [f"{ind}    let qa{r} = {_at('q_t', f'(ty * RT + {r}u)', 'c', 'STR')};\n"
            f"{ind}    let oa{r} = {_at('do_t', f'(ty * RT + {r}u)', 'c', 'STR')};" for r in range(rt)]
    step += [f"{ind}    let kb{c} = {_at('k_t', f'(tx + {tx * c}u)', 'c', 'STR')};\n"
             f"{ind}    let vb{c} = {_at('v_t', f'(tx + {tx * c}u)', 'c', 'STR')};" for c in range(ct)]
    step += [f"{ind}    s{r}_{c} = s{r}_{c} + dot(qa{r}, kb{c});\n"
             f"{ind}    dp{r}_{c} = dp{r}_{c} + dot(oa{r}, vb{c});" for r, c in rc]
    plan = ATTENTION_BWD_PLAN
    out.append(_steps("c", dv4, "\n".join(step), ind, "c" in plan["unroll"] and rt * ct <= plan["unroll_scores"]))
    for r in range(rt):
        out += [f"{ind}let row{r} = ty * RT + {r}u;", f"{ind}let qi{r} = i0 + row{r};",
                f"{ind}let lse{r} = {lse.format(r=r)};", f"{ind}let dd{r} = {delta.format(r=r)};"]
        for c in range(ct):
            # causal: query i sees key j when j <= i + (T - S); rows and keys past the ends get P = 0
            at = (f"row{r}", f"tx + {tx * c}u", f"{width}u")
            out += [f"{ind}let kj{r}_{c} = j0 + tx + {tx * c}u;",
                    f"{ind}let ok{r}_{c} = qi{r} < S && kj{r}_{c} < T && (!CAUSAL || kj{r}_{c} <= qi{r} + (T - S));",
                    f"{ind}let p{r}_{c} = select(0.0, exp(s{r}_{c} * SCALE - lse{r}), ok{r}_{c});",
                    f"{ind}{_at('ds_t', *at)} = p{r}_{c} * (dp{r}_{c} - dd{r});"]
            if p_store:
                out.append(f"{ind}{_at('p_t', *at)} = p{r}_{c};")
    return "\n".join(out)


def _store_rows(buf: str, rows: int, nch: int, tx: int, dv4: int, row: str, limit: str, index: str, mul: str) -> str:
    """WGSL storing accumulators buf{r}_{n} (rows `row` + r, vec4 columns tx + TX n) that are in
    range; `index` gives a row's index in the output, [b, h, t, d] or [b, t, h, d]."""
    out = []
    for r in range(rows):
        for n_ in range(nch):
            cond = f"{row} + {r}u < {limit}" + (f" && tx + {tx * n_}u < DV4" if tx * (n_ + 1) > dv4 else "")
            out.append(f"    if ({cond}) {{\n"
                       f"        let o = {index.format(row=f'{row} + {r}u')} * DV4 * 4u + (tx + {tx * n_}u) * 4u;\n"
                       + "".join(f"        {buf}[o + {j}u] = {buf}{r}_{n_}.{x}{mul};\n" for j, x in enumerate("xyzw"))
                       + "    }")
    return "\n".join(out)


LANES = 16  # threads along each side of a backward workgroup, where that pays (see _lanes)


def _lanes(block: int, dv4: int) -> int:
    """16 x 16 threads hide workgroup-memory latency better than 8 x 8 (H200, d = 64: 1.4x), but
    only when a row of dQ, dK, dV is 16 vec4s: else columns idle (d = 16: 1.2x slower)."""
    return LANES if block % LANES == 0 and dv4 % LANES == 0 else 8


def attention_backward(sched: Schedule, k: Kernel) -> list:
    """attention_grad siblings (dQ, dK, dV of one attention) as FlashAttention-2's backward:
    kernels/attention_dq.wgsl (dQ, and D = rowsum(dO * O) into a scratch buffer), then
    kernels/attention_dkv.wgsl (dK, dV), both recomputing P from the forward's log-sum-exp.
    Outputs that only a head transpose reads are written in its [b, t, h, d] layout."""
    from .codegen import f32_literal
    from .ops_layers import _attention_scale, backward_blocks

    g = sched.graph
    wrt = {g.nodes[r].attr("wrt"): r for r in k.roots}
    n = g.nodes[k.roots[0]]
    (b, h, s, d), (hk, t) = g.nodes[n.inputs[0]].shape, g.nodes[n.inputs[1]].shape[1:3]
    dv4, stride = d // 4, d // 4 + 1
    (bq, bk), (bc, br) = backward_blocks(d)
    # fewer workgroups than an H200 has SMs: halve the blocks that count them (DINOv2-S at batch 1:
    # 54 -> 102 workgroups, 1.17x); with more, the bigger blocks' reuse wins
    bq = 16 if bq == 32 and -(-s // 32) * b * h < 132 else bq
    bc = 16 if bc == 32 and -(-t // 32) * b * hk < 132 else bc
    temp = ("temp", next(_temp_ids))  # D per query row
    common = {"S": s, "T": t, "H": h, "HK": hk, "REP": h // hk, "DV4": dv4, "STR": stride,
              "CAUSAL": str(bool(n.attr("causal"))).lower(), "SCALE": f32_literal(_attention_scale(dict(n.attrs), d))}

    def inputs(names, ids):
        """Binds the strided inputs; their stride constants and vec4 loader functions."""
        bind, subs, loaders = _Bindings(g, sched.storage), {}, []
        for name, i in zip(names, ids):
            key = {"dout": "D"}.get(name, name.upper())
            subs.update(zip((f"{key}SB", f"{key}SH", f"{key}ST"), _bind_strided(sched, bind, i)))
            loaders.append(_loader(f"{'do' if name == 'dout' else name}4", name, vec4))
        bind.use(n.inputs[5], own=True)  # lse
        return bind, list(names) + ["lse"], subs, "\n".join(loaders)

    vec4, two = ATTENTION_BWD_PLAN["vec4_loads"], ATTENTION_BWD_PLAN["tiles_2d"]

    def declare(bind, names):
        decls = bind.decls(names)
        return as_vec4(decls, [x for x in names if x in ("q", "k", "v", "o", "dout")]) if vec4 else decls

    # dQ (and D) over query blocks: TY x TX threads, RT query rows and NCH vec4 columns of dQ each
    bind, names, subs, loaders = inputs(["q", "k", "v", "o", "dout"], n.inputs[:5])
    ty, tx = _lanes(bq, dv4), _lanes(bk, dv4)
    rt, nch = bq // ty, -(-dv4 // tx)
    rn = [(r, c) for r in range(rt) for c in range(nch)] if 0 in wrt else []
    step = "\n".join([f"            let a{r} = {_at('ds_t', f'(ty * RT + {r}u)', 'jj', 'BK')};" for r in range(rt)]
                     + [f"            let kk{c} = {_at('k_t', 'jj', f'min(tx + {tx * c}u, DV4 - 1u)', 'STR')};"
                        for c in range(nch)]
                     + [f"            dq{r}_{c} = dq{r}_{c} + a{r} * kk{c};" for r, c in rn]) if rn else ""
    store = ""
    chunks, per = _chunks(-(-s // bq) * b * h, -(-t // bk)) if rn else (1, -(-t // bk))
    partial = ("temp", next(_temp_ids)) if chunks > 1 else None
    if rn:
        names.append("dq")
        if partial:
            bind.use_key(partial, write=True)
            index = f"(wg.z * {b * h * s}u + bh * S + {{row}})"
        else:
            bind.use(wrt[0], write=True, own=True)
            index = "((b * S + {row}) * H + h)" if wrt[0] in sched.written else "(bh * S + {row})"
        store = _store_rows("dq", rt, nch, tx, dv4, "i0 + ty * RT", "S", index, " * SCALE")
    decls = declare(bind, names) + f"\n@group(0) @binding({len(names)}) var<storage, read_write> delta: array<f32>;"
    tile = _score_tile(rt, bk // tx, tx, bk, "lse_t[row{r}]", "d_t[row{r}]", False, " " * 8, dv4) if rn else ""
    wgsl = render("attention_dq", BINDINGS=decls, LOADERS=loaders, BQ=bq, BK=bk, KC=per * bk, RT=rt, NT=ty * tx, TX=tx,
                  QD_TILE=tile_type(bq, stride, two), KV_TILE=tile_type(bk, stride, two),
                  DS_TILE=tile_type(bq, bk, two, "f32"),
                  WANT_DQ=str(bool(rn)).lower(), TILE=tile,
                  ACC_DECL="\n".join(f"    var dq{r}_{c} = vec4<f32>(0.0);" for r, c in rn),
                  DQ_STEPS=_steps("jj", bk, step, " " * 8) if step else "", STORE=store, **subs, **common, **_template_at())
    dq = KernelCode(wgsl, (ty * tx, 1, 1), bind.list() + [(temp, "read_write")], (-(-s // bq), b * h, chunks),
                    "attention_dq" + ("/split" if partial else ""))
    dq.temps = {temp: b * h * s * 4}
    codes = [dq]
    if partial:
        dq.temps[partial] = chunks * b * h * s * d * 4
        codes.append(_sum_partials(sched, [(partial, wrt[0], b * h * s * d)], chunks, h, s, d, "attention_dq/sum"))
    if 1 not in wrt and 2 not in wrt:
        return codes
    # dK and dV over key blocks: RJ key rows and NCH vec4 columns of each per thread
    bind, names, subs, loaders = inputs(["q", "k", "v", "dout"], [n.inputs[i] for i in (0, 1, 2, 4)])
    chunks, per = _chunks(-(-t // bc) * b * hk, -(-s // br))
    partials = {}
    for w, name in ((1, "dk"), (2, "dv")):
        if w in wrt:
            if chunks > 1:
                partials[w] = ("temp", next(_temp_ids))
                bind.use_key(partials[w], write=True)
            else:
                bind.use(wrt[w], write=True, own=True)
            names.append(name)
    ty, tx = min(_lanes(br, dv4), _lanes(bc, dv4)), _lanes(bc, dv4)
    rj, nch = bc // ty, -(-dv4 // tx)
    rn = [(r, c) for r in range(rj) for c in range(nch)]
    ind = " " * 16
    step = "\n".join([f"{ind}let pp{r} = {_at('p_t', 'ii', f'ty * RJ + {r}u', 'BC')};\n"
                      f"{ind}let sd{r} = {_at('ds_t', 'ii', f'ty * RJ + {r}u', 'BC')};" for r in range(rj)]
                     + [f"{ind}let ob{c} = {_at('do_t', 'ii', f'min(tx + {tx * c}u, DV4 - 1u)', 'STR')};\n"
                        f"{ind}let qb{c} = {_at('q_t', 'ii', f'min(tx + {tx * c}u, DV4 - 1u)', 'STR')};" for c in range(nch)]
                     + [f"{ind}dv{r}_{c} = dv{r}_{c} + pp{r} * ob{c};\n{ind}dk{r}_{c} = dk{r}_{c} + sd{r} * qb{c};"
                        for r, c in rn])
    store = "\n".join(_store_rows(name, rj, nch, tx, dv4, "j0 + ty * RJ", "T", f"(wg.z * {b * hk * t}u + bhk * T + {{row}})"
                                  if partials else "((b * T + {row}) * HK + hk)" if wrt[w] in sched.written
                                  else "(bhk * T + {row})", mul)
                      for w, name, mul in ((1, "dk", " * SCALE"), (2, "dv", "")) if w in wrt)
    decls = declare(bind, names) + f"\n@group(0) @binding({len(names)}) var<storage, read> delta: array<f32>;"
    tile = _score_tile(br // ty, bc // tx, tx, bc, "lse[bh * S + min(qi{r}, S - 1u)]",
                       "delta[bh * S + min(qi{r}, S - 1u)]", True, " " * 12, dv4)
    wgsl = render("attention_dkv", BINDINGS=decls, LOADERS=loaders, BC=bc, BR=br, QC=per * br, RT=br // ty, RJ=rj,
                  NT=ty * tx, TX=tx, TILE=tile,
                  KV_TILE=tile_type(bc, stride, two), QD_TILE=tile_type(br, stride, two),
                  P_TILE=tile_type(br, bc, two, "f32"),
                  ACC_DECL="\n".join(f"    var dk{r}_{c} = vec4<f32>(0.0);\n    var dv{r}_{c} = vec4<f32>(0.0);"
                                     for r, c in rn),
                  DKV_STEPS=_steps("ii", br, step, " " * 12), STORE=store, **subs, **common, **_template_at())
    dkv = KernelCode(wgsl, (ty * tx, 1, 1), bind.list() + [(temp, "read")], (-(-t // bc), b * hk, chunks),
                     "attention_dkv" + ("/split" if partials else ""))
    codes.append(dkv)
    if partials:
        size = b * hk * t * d
        dkv.temps = {p: chunks * size * 4 for p in partials.values()}
        codes.append(_sum_partials(sched, [(p, wrt[w], size) for w, p in partials.items()], chunks, hk, t, d,
                                   "attention_dkv/sum"))
    return codes

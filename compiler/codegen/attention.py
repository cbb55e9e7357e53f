"""WGSL for attention: the fused forward (templates/attention.wgsl) and FlashAttention-2's
backward (templates/attention_dq.wgsl, templates/attention_dkv.wgsl), reading q, k, v through
strides so that head transposes need no copies. The key split of the forward and the chunks of
the backward's loops follow the schedule's plans (options.attention, options.attention_backward)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ...runtime.package import QUICK
from ..ir.ops_layers import attention_scale, backward_blocks
from ..passes.records import Kernel, Schedule, base_of
from .common import WG, Bindings, KernelCode, as_vec4, grid, per_output, shared_loads, strides_of, tile_type
from .lift_sizes import LOOPED
from .wgsl import f32_literal, render

# the forward kernel's key and value tiles take at most this much workgroup memory: tiles of 32
# keys up to 128-wide heads, fewer keys past that (160-wide heads: 25), so that devices allowing
# 32 KiB (lavapipe, Apple) run every model
SHARED_BUDGET = 32768
# the quick tier's forward kernel keeps the head dimension in loops from this many vec4s (68-wide
# heads; 64-wide ones stay written out): written out, wide heads (40 vec4 accumulators a thread
# at 160) are the slowest of a first tier's kernels for the driver to compile
QUICK_LOOPS_FROM = 17


def _bind_strided(sched: Schedule, bind: Bindings, i: int) -> tuple:
    """Binds input `i` to a slot of its own and returns its (batch, head, token) strides;
    a head transpose in front of it (a schedule view) is read in place: [b, t, h, d] strides,
    permuted."""
    g = sched.graph
    if i in sched.views:
        st = strides_of(g.nodes[g.nodes[i].inputs[0]].shape)
        bind.use(sched.views[i], own=True)
        return st[0], st[2], st[1]
    if i in sched.written:  # an attention output its kernel wrote in [b, t, h, d] layout
        st = strides_of(g.nodes[sched.written[i]].shape)
        bind.use(i, own=True)
        return st[0], st[2], st[1]
    st = strides_of(g.nodes[i].shape)
    bind.use(base_of(g, i), own=True)
    return st[0], st[1], st[2]


# ---- forward

def _key_split(plan: Mapping, blocks: int, t: int) -> tuple:
    """(ranges, keys per range) of the forward's `t` keys over `blocks` query blocks: few query
    blocks (one row per thread) cannot fill a GPU, so the keys are split across workgroups and
    the partial softmaxes merged after (flash-decoding), in ranges of whole tiles of 32."""
    fill = plan["fill"]
    split = 1 if blocks >= fill or t < plan["min_keys"] else max(1, min(16, -(-fill // blocks), t // plan["min_split_keys"]))
    kl = -(-(-(-t // split)) // 32) * 32
    return -(-t // kl), kl


@dataclass(frozen=True)
class _ForwardOut:
    """Where the forward kernel writes: its bindings' declarations and slots, and its STORE."""
    decls: str
    slots: list
    store: str
    row_of: str | None  # the output row's index expression (unsplit)
    temp: tuple | None  # the partial softmaxes' buffer (split)


def _forward_out(sched: Schedule, bind: Bindings, names: list, r_out, r_lse, split: int, dv4: int,
                 heads: int) -> _ForwardOut:
    """Unsplit: the normalised output (in [b, s, h, d] layout when the head transpose after it is
    all that reads it) and the log-sum-exp; split: each range's max, sum and accumulators."""
    if split == 1:
        row_of = "((b * S + row) * H + h)" if r_out in sched.written else "(bh * S + row)"
        store = ["        let inv = 1.0 / l;", f"        let o = {row_of} * DV4 * 4u;"]
        if r_out is not None:
            store += [f"        out[o + {4 * c}u] = acc{c}.x * inv; out[o + {4 * c + 1}u] = acc{c}.y * inv; "
                      f"out[o + {4 * c + 2}u] = acc{c}.z * inv; out[o + {4 * c + 3}u] = acc{c}.w * inv;"
                      for c in range(dv4)]
        if r_lse is not None:
            store.append("        lse[bh * S + row] = m + log(l);")
        return _ForwardOut(bind.decls(names), bind.list(), "\n".join(store), row_of, None)
    temp = sched.new_temp()
    decls = "\n".join(bind.decls(names).splitlines()[:3]) + \
        "\n@group(0) @binding(3) var<storage, read_write> part: array<f32>;"
    width = 4 * dv4 + 2
    store = (f"        let o = ((split * {heads}u + bh) * S + row) * {width}u;\n        part[o] = m;\n"
             "        part[o + 1u] = l;\n" + "\n".join(
                 f"        part[o + {2 + 4 * c}u] = acc{c}.x; part[o + {3 + 4 * c}u] = acc{c}.y; "
                 f"part[o + {4 + 4 * c}u] = acc{c}.z; part[o + {5 + 4 * c}u] = acc{c}.w;" for c in range(dv4)))
    return _ForwardOut(decls, bind.list()[:3] + [(temp, "read_write")], store, None, temp)


def _forward_body(shared: bool, dv4: int, tile: int) -> dict:
    """The forward kernel's key loop: keys and values from tiles staged in workgroup memory
    (`shared`: key * DV4 + vec4), or read straight from memory (CPU rasterisers)."""
    def key(c):
        return f"k_tile[jj * {dv4}u + {c}u]" if shared else f"k4(k_base, j, {c}u)"

    def val(c):
        return f"v_tile[jj * {dv4}u + {c}u]" if shared else f"v4(v_base, j, {c}u)"
    score = "            let s = (" + " + ".join(f"dot(q{c}, {key(c)})" for c in range(dv4)) + ") * SCALE;"
    update = "\n".join(f"                acc{c} = acc{c} * corr + p * {val(c)};" for c in range(dv4))
    stage = ""
    if shared:
        stage = "\n".join([
            f"        for (var i = lid; i < TILE * {dv4}u; i = i + 64u) {{",
            f"            let jj = i / {dv4}u;", f"            let c = i % {dv4}u;",
            "            let jk = min(j0 + jj, T - 1u);",
            "            k_tile[i] = k4(k_base, jk, c);",
            "            v_tile[i] = v4(v_base, jk, c);",
            "        }", "        workgroupBarrier();"])
    return dict(SCORE=score, ACC_UPDATE=update, STAGE=stage,
                STAGE_END="        workgroupBarrier();" if shared else "",
                SHARED="shared" if shared else "not shared",
                TILE_TYPE=tile_type(tile, dv4, False) if shared else "array<vec4<f32>, 1>",
                TILE=tile if shared else 32)


# the CPU rasterisers' kernel keeps 2 query rows an invocation while their written-out state
# (16 vec4s a row per 64 of head width) stays within this many vec4s, else 1: LLVM's time
# over the kernel grows faster than its rows, and a session compiles it each time
# (bench/REJECTED.md: 4 and 8 rows)
CPU_STATE_VEC4S = 32


def _head(common: dict, quads: bool = False) -> str:
    """templates/attention_head.wgsl for `common`'s sizes; `quads`: keys and values read 16
    bytes at a time (their bindings retyped by as_vec4)."""
    read = {n: f"{n}[o / 4u]" if quads else f"vec4<f32>({n}[o], {n}[o + 1u], {n}[o + 2u], {n}[o + 3u])" for n in "kv"}
    return render("attention_head", **{k: common[k] for k in ("S", "T", "H", "HK", "REP", "DV4", "SCALE", "CAUSAL",
                                                               "SPLIT", "KL", "KST", "VST")}, K4=read["k"], V4=read["v"])


def _cpu_variant(common: dict, dv4: int, s: int, heads: int, split: int, quads: bool) -> tuple:
    """(WGSL, workgroup size, workgroups) of templates/attention_cpu.wgsl: 1 or 2 rows an
    invocation, each row's code written out from the GPU kernel's (its STORE runs in a block
    that names the row's state as the GPU kernel does)."""
    n_rows = 2 if 2 * dv4 <= CPU_STATE_VEC4S else 1
    rows = range(n_rows)
    setup, update, store = [], [], []
    for i in rows:
        setup += [f"    let row{i} = first + {i}u;", f"    let qrow{i} = min(row{i}, S - 1u);",
                  f"    let q{i}_base = b * {common['QSB']}u + h * {common['QSH']}u + qrow{i} * {common['QST']}u;"]
        setup += [f"    let q{i}_{c} = vec4<f32>(q[q{i}_base + {4 * c}u], q[q{i}_base + {4 * c + 1}u], "
                  f"q[q{i}_base + {4 * c + 2}u], q[q{i}_base + {4 * c + 3}u]);" for c in range(dv4)]
        setup += [f"    var m{i} = -3.4028235e38;", f"    var l{i} = 0.0;",
                  f"    let last{i} = select(T, min(T, qrow{i} + (T - S) + 1u), CAUSAL);"]
        setup += [f"    var acc{i}_{c} = vec4<f32>(0.0);" for c in range(dv4)]
        dots = " + ".join(f"dot(q{i}_{c}, kc{c})" for c in range(dv4))
        update += [f"        if (!CAUSAL || j < last{i}) {{", f"            let s = ({dots}) * SCALE;",
                   f"            let mx = max(m{i}, s);", f"            let corr = exp(m{i} - mx);",
                   "            let p = exp(s - mx);", f"            l{i} = l{i} * corr + p;", f"            m{i} = mx;"]
        update += [f"            acc{i}_{c} = acc{i}_{c} * corr + p * vc{c};" for c in range(dv4)]
        update.append("        }")
        names = [f"let row = row{i};", f"let m = m{i};", f"let l = l{i};"] + [
            f"let acc{c} = acc{i}_{c};" for c in range(dv4)]
        store += [f"    if (row{i} < S) {{", "        " + " ".join(names), common["STORE"], "    }"]
    loads = shared_loads("kc", "k4(k_base, j, {})", dv4, "lid") + shared_loads("vc", "v4(v_base, j, {})", dv4, "lid")
    keep = {k: v for k, v in common.items() if k not in ("Q_LOAD", "ACC_DECL", "STORE")}
    if quads:  # keys and values 16 bytes a read: a quarter of the reads
        keep["BINDINGS"] = as_vec4(keep["BINDINGS"], "kv")
        keep["HEAD"] = _head(common, quads=True)
    wgsl = render("attention_cpu", **keep, ROWS=n_rows, ROW_SETUP="\n".join(setup), KEY_LOAD="\n".join(loads),
                  ROW_UPDATE="\n".join(update), ROW_STORE="\n".join(store))
    return wgsl, (8, 1, 1), (-(-s // (8 * n_rows)), heads, split)


def _looped_head(dv4: int, split: int, out: bool, lse: bool, row_of: str | None, heads: int) -> dict:
    """The forward kernel's head-dimension code as loops over a private array of vec4s instead of
    DV4 written-out vec4 variables: much less for the driver to compile, and slower to run
    (the array lives in memory), so only the quick tier has it (see QUICK_LOOPS_FROM)."""
    each = "for (var c = 0u; c < DV4; c = c + 1u)"
    parts = {
        "Q_LOAD": f"    {LOOPED}\n    var qv: array<vec4<f32>, {dv4}>;\n    {each} {{\n        let o = q_base + 4u * c;\n"
                  "        qv[c] = vec4<f32>(q[o], q[o + 1u], q[o + 2u], q[o + 3u]);\n    }",
        "ACC_DECL": f"    var acc: array<vec4<f32>, {dv4}>;",
        "SCORE": f"            var qk = 0.0;\n            {each} {{ qk = qk + dot(qv[c], k_tile[jj * {dv4}u + c]); }}\n"
                 "            let s = qk * SCALE;",
        "ACC_UPDATE": f"                {each} {{ acc[c] = acc[c] * corr + p * v_tile[jj * {dv4}u + c]; }}"}
    if split == 1:
        store = ["        let inv = 1.0 / l;", f"        let o = {row_of} * DV4 * 4u;"]
        if out:
            store.append(f"        {each} {{\n            let a = acc[c] * inv;\n"
                         "            out[o + 4u * c] = a.x; out[o + 4u * c + 1u] = a.y; "
                         "out[o + 4u * c + 2u] = a.z; out[o + 4u * c + 3u] = a.w;\n        }")
        if lse:
            store.append("        lse[bh * S + row] = m + log(l);")
    else:
        store = [f"        let o = ((split * {heads}u + bh) * S + row) * {4 * dv4 + 2}u;", "        part[o] = m;",
                 "        part[o + 1u] = l;",
                 (f"        {each} {{\n            let a = acc[c];\n"
                  "            part[o + 2u + 4u * c] = a.x; part[o + 3u + 4u * c] = a.y; "
                  "part[o + 4u + 4u * c] = a.z; part[o + 5u + 4u * c] = a.w;\n        }")]
    return {**parts, "STORE": "\n".join(store)}


def _merge(sched: Schedule, bind: Bindings, names: list, temp, r_out, r_lse, b: int, h: int, s: int, d: int,
           split: int) -> KernelCode:
    """The kernel merging the key ranges' partial softmaxes: a thread per output value (the
    merge must not starve the GPU either)."""
    width = 4 * (d // 4) + 2  # (a range's max, sum and accumulators, as _forward_out lays them out)
    body = "\n".join([
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
    decls = "\n".join(["@group(0) @binding(0) var<storage, read> part: array<f32>;"] + [
        f"@group(0) @binding({j + 1}) var<storage, read_write> {name}: array<f32>;"
        for j, name in enumerate(names[3:])])
    rows = b * h * s
    return KernelCode(per_output(decls, rows * d, body), (WG, 1, 1), [(temp, "read")] + bind.list()[3:],
                      grid(-(-rows * d // WG)), "attention/merge")


def attention(sched: Schedule, k: Kernel) -> KernelCode:
    """Fused attention (see templates/attention.wgsl); a CPU-rasteriser variant reads keys and
    values straight from memory instead of staging them behind barriers. The kernel also
    writes each row's log-sum-exp when the graph holds an attention_lse sibling (training),
    and the gradient's siblings become the two backward kernels."""
    g = sched.graph
    roots = {g.nodes[r].op: r for r in k.roots}
    if "attention_grad" in roots:
        return attention_backward(sched, k)
    r_out, r_lse = roots.get("attention"), roots.get("attention_lse")
    n = g.nodes[k.roots[0]]
    q, kk = g.nodes[n.inputs[0]], g.nodes[n.inputs[1]]
    b, h, s, d = q.shape
    hk, t = kk.shape[1], kk.shape[2]
    dv4 = d // 4
    scale = n.attr("scale")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    bind = Bindings(sched)
    (qsb, qsh, qst), (ksb, ksh, kst), (vsb, vsh, vst) = (_bind_strided(sched, bind, i) for i in n.inputs)
    names = ["q", "k", "v"] + (["out"] if r_out is not None else []) + (["lse"] if r_lse is not None else [])
    for r in (r_out, r_lse):
        if r is not None:
            bind.use(r, write=True, own=True)
    split, kl = _key_split(sched.options.attention, -(-s // 64) * b * h, t)
    out = _forward_out(sched, bind, names, r_out, r_lse, split, dv4, b * h)
    q_load = "\n".join(f"    let q{c} = vec4<f32>(q[q_base + {4 * c}u], q[q_base + {4 * c + 1}u], "
                       f"q[q_base + {4 * c + 2}u], q[q_base + {4 * c + 3}u]);" for c in range(dv4))
    acc = "\n".join(f"    var acc{c} = vec4<f32>(0.0);" for c in range(dv4))
    common = dict(BINDINGS=out.decls, S=s, T=t, H=h, HK=hk, REP=h // hk, DV4=dv4, SCALE=f32_literal(scale), SPLIT=split,
                  KL=kl, QSB=qsb, QSH=qsh, QST=qst, KSB=ksb, KSH=ksh, KST=kst, VSB=vsb, VSH=vsh, VST=vst,
                  CAUSAL="true" if n.attr("causal") else "false", Q_LOAD=q_load, ACC_DECL=acc, STORE=out.store)
    common["HEAD"] = _head(common)
    tile = max(1, min(32, SHARED_BUDGET // (2 * 16 * dv4)))  # keys per staged tile: k and v, 16 bytes a vec4
    groups = (-(-s // 64), b * h, split)
    code = KernelCode(render("attention", **common, **_forward_body(True, dv4, tile)), (64, 1, 1), out.slots, groups,
                      "attention")
    quads = all(x % 4 == 0 for x in (ksb, ksh, kst, vsb, vsh, vst)) and not any(bind.half(i) for i in n.inputs[1:3])
    code.variants = {"cpu": _cpu_variant(common, dv4, s, b * h, split, quads)}
    if dv4 >= QUICK_LOOPS_FROM:  # the quick tier: the head dimension in loops (see QUICK_LOOPS_FROM)
        looped = {**common, **_forward_body(True, dv4, tile),
                  **_looped_head(dv4, split, r_out is not None, r_lse is not None, out.row_of, b * h)}
        code.variants[QUICK] = (render("attention", **looped), (64, 1, 1), groups)
    if split == 1:
        return code
    code.temps = {out.temp: split * b * h * s * (4 * dv4 + 2) * 4}
    return [code, _merge(sched, bind, names, out.temp, r_out, r_lse, b, h, s, d, split)]


# ---- backward

def _loader(fn: str, buf: str) -> str:
    """fn(base, c): vec4 c of the row at element `base` of `buf`."""
    return (f"fn {fn}(base: u32, c: u32) -> vec4<f32> {{\n    let x = base + c * 4u;\n"
            f"    return vec4<f32>({buf}[x], {buf}[x + 1u], {buf}[x + 2u], {buf}[x + 3u]);\n}}")


def _at(name: str, row: str, col: str) -> str:
    """A backward kernel's workgroup-tile element: tiles are [row][column], so that wgpu's bounds
    checks clamp a row once per loop step, not every read."""
    return f"{name}[{row}][{col}]"


def _steps(var: str, count: int, body: str, ind: str, unroll: bool) -> str:
    """WGSL running `body` for `var` = 0 .. count - 1: a block per step with `var` a constant
    (`unroll`: wgpu bounds every loop with a counter, which keeps the driver from unrolling
    it, and a constant index needs no clamp), or a loop."""
    if unroll:
        return "\n".join(f"{ind}{{\n{ind}    let {var} = {i}u;\n{body}\n{ind}}}" for i in range(count))
    return f"{ind}for (var {var} = 0u; {var} < {count}u; {var} = {var} + 1u) {{\n{body}\n{ind}}}"


def _chunks(plan: Mapping, workgroups: int, blocks: int) -> tuple:
    """(chunks, blocks per chunk) of a backward kernel's loop of `blocks` steps: with fewer
    workgroups than plan["fill"], the loop is cut into chunks run by workgroups of their own."""
    fill = plan["fill"]
    c = max(1, min(plan["max_chunks"], -(-fill // workgroups), blocks // plan["min_blocks"])) if fill else 1
    per = -(-blocks // c)
    return -(-blocks // per), per


def _sum_partials(sched, parts, chunks, heads, rows, d, label):
    """The pass adding up `chunks` partial sums ([chunk, batch * heads, rows, d] each) into
    their outputs; parts: (temp key, output node, size) triples."""
    bind = Bindings(sched)
    total = parts[0][2]
    body = [f"    let c = idx % {d}u;", f"    let row = (idx / {d}u) % {rows}u;", f"    let bh = idx / {rows * d}u;"]
    for part, out, _ in parts:
        src, dst = bind.use_key(part), bind.use(out, write=True)
        at = f"(((bh / {heads}u) * {rows}u + row) * {heads}u + bh % {heads}u) * {d}u + c" \
            if out in sched.written else "idx"
        body.append(f"    {dst}[{at}] = " + " + ".join(f"{src}[{z * total}u + idx]" for z in range(chunks)) + ";")
    return KernelCode(per_output(bind.decls(), total, "\n".join(body)), (WG, 1, 1), bind.list(),
                      grid(-(-total // WG)), label)


def _score_tile(rt: int, ct: int, tx: int, lse: str, delta: str, p_store: bool, ind: str, dv4: int,
                unroll_scores: int) -> str:
    """WGSL for one tile step of both backward kernels: scores and dP = dO v^T for query rows
    ty * RT + r and key columns tx + TX c (separate variables, loops unrolled here: private
    arrays indexed in loops are slow on NVIDIA), then P and dS into workgroup memory. The
    column loop is written out where a thread holds at most `unroll_scores` scores."""
    rc = [(r, c) for r in range(rt) for c in range(ct)]
    out = [f"{ind}var s{r}_{c} = 0.0;\n{ind}var dp{r}_{c} = 0.0;" for r, c in rc]
    step = [f"{ind}    let qa{r} = {_at('q_t', f'(ty * RT + {r}u)', 'c')};\n"
            f"{ind}    let oa{r} = {_at('do_t', f'(ty * RT + {r}u)', 'c')};" for r in range(rt)]
    step += [f"{ind}    let kb{c} = {_at('k_t', f'(tx + {tx * c}u)', 'c')};\n"
             f"{ind}    let vb{c} = {_at('v_t', f'(tx + {tx * c}u)', 'c')};" for c in range(ct)]
    step += [f"{ind}    s{r}_{c} = s{r}_{c} + dot(qa{r}, kb{c});\n"
             f"{ind}    dp{r}_{c} = dp{r}_{c} + dot(oa{r}, vb{c});" for r, c in rc]
    out.append(_steps("c", dv4, "\n".join(step), ind, rt * ct <= unroll_scores))
    for r in range(rt):
        out += [f"{ind}let row{r} = ty * RT + {r}u;", f"{ind}let qi{r} = i0 + row{r};",
                f"{ind}let lse{r} = {lse.format(r=r)};", f"{ind}let dd{r} = {delta.format(r=r)};"]
        for c in range(ct):
            # causal: query i sees key j when j <= i + (T - S); rows and keys past the ends get P = 0
            at = (f"row{r}", f"tx + {tx * c}u")
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
    """16 x 16 threads hide workgroup-memory latency better than 8 x 8, but only when a row of
    dQ, dK, dV is 16 vec4s: else columns idle."""
    return LANES if block % LANES == 0 and dv4 % LANES == 0 else 8


@dataclass(frozen=True)
class _Backward:
    """One attention's backward: its graph node, shapes, block sizes and what both kernels share."""
    n: object  # the first attention_grad node (inputs q, k, v, o, dO, lse)
    wrt: dict  # input position (0: q, 1: k, 2: v) -> the attention_grad node computing its gradient
    b: int
    h: int
    s: int
    d: int
    hk: int
    t: int
    blocks: tuple  # (bq, bk, bc, br): dQ's query and key blocks, dK/dV's key and query blocks
    delta: tuple  # the temp holding D = rowsum(dO * O) per query row
    common: dict  # template holes both kernels share

    @property
    def dv4(self) -> int:
        return self.d // 4


def _bind_inputs(sched: Schedule, bw: _Backward, names: list, ids) -> tuple:
    """Binds the strided inputs and lse: (bindings, names, stride constants, vec4 loaders)."""
    bind, subs, loaders = Bindings(sched), {}, []
    for name, i in zip(names, ids):
        key = {"dout": "D"}.get(name, name.upper())
        subs.update(zip((f"{key}SB", f"{key}SH", f"{key}ST"), _bind_strided(sched, bind, i)))
        loaders.append(_loader(f"{'do' if name == 'dout' else name}4", name))
    bind.use(bw.n.inputs[5], own=True)  # lse
    return bind, list(names) + ["lse"], subs, "\n".join(loaders)


def _dq_kernels(sched: Schedule, bw: _Backward) -> list:
    """attention_dq.wgsl over query blocks (dQ, and D for the key side): TY x TX threads, RT
    query rows and NCH vec4 columns of dQ each; with its loop over keys cut into chunks, a
    pass adding up their partial sums after."""
    plan = sched.options.attention_backward
    (b, h, s, d, t, dv4), (bq, bk, _, _) = (bw.b, bw.h, bw.s, bw.d, bw.t, bw.dv4), bw.blocks
    stride = dv4 + 1
    bind, names, subs, loaders = _bind_inputs(sched, bw, ["q", "k", "v", "o", "dout"], bw.n.inputs[:5])
    ty, tx = _lanes(bq, dv4), _lanes(bk, dv4)
    rt, nch = bq // ty, -(-dv4 // tx)
    rn = [(r, c) for r in range(rt) for c in range(nch)] if 0 in bw.wrt else []
    step = "\n".join([f"            let a{r} = {_at('ds_t', f'(ty * RT + {r}u)', 'jj')};" for r in range(rt)]
                     + [f"            let kk{c} = {_at('k_t', 'jj', f'min(tx + {tx * c}u, DV4 - 1u)')};"
                        for c in range(nch)]
                     + [f"            dq{r}_{c} = dq{r}_{c} + a{r} * kk{c};" for r, c in rn]) if rn else ""
    store = ""
    chunks, per = _chunks(plan, -(-s // bq) * b * h, -(-t // bk)) if rn else (1, -(-t // bk))
    partial = sched.new_temp() if chunks > 1 else None
    if rn:
        names.append("dq")
        if partial:
            bind.use_key(partial, write=True)
            index = f"(wg.z * {b * h * s}u + bh * S + {{row}})"
        else:
            bind.use(bw.wrt[0], write=True, own=True)
            index = "((b * S + {row}) * H + h)" if bw.wrt[0] in sched.written else "(bh * S + {row})"
        store = _store_rows("dq", rt, nch, tx, dv4, "i0 + ty * RT", "S", index, " * SCALE")
    decls = bind.decls(names) + f"\n@group(0) @binding({len(names)}) var<storage, read_write> delta: array<f32>;"
    tile = _score_tile(rt, bk // tx, tx, "lse_t[row{r}]", "d_t[row{r}]", False, " " * 8, dv4,
                       plan["unroll_scores"]) if rn else ""
    wgsl = render("attention_dq", BINDINGS=decls, LOADERS=loaders, BQ=bq, BK=bk, KC=per * bk, RT=rt, NT=ty * tx, TX=tx,
                  QD_TILE=tile_type(bq, stride, True), KV_TILE=tile_type(bk, stride, True),
                  DS_TILE=tile_type(bq, bk, True, "f32"), WANT_DQ=str(bool(rn)).lower(), TILE=tile,
                  ACC_DECL="\n".join(f"    var dq{r}_{c} = vec4<f32>(0.0);" for r, c in rn),
                  DQ_STEPS=_steps("jj", bk, step, " " * 8, True) if step else "", STORE=store, **subs, **bw.common)
    dq = KernelCode(wgsl, (ty * tx, 1, 1), bind.list() + [(bw.delta, "read_write")], (-(-s // bq), b * h, chunks),
                    "attention_dq" + ("/split" if partial else ""))
    dq.temps = {bw.delta: b * h * s * 4}
    if not partial:
        return [dq]
    dq.temps[partial] = chunks * b * h * s * d * 4
    return [dq, _sum_partials(sched, [(partial, bw.wrt[0], b * h * s * d)], chunks, h, s, d, "attention_dq/sum")]


def _dkv_kernels(sched: Schedule, bw: _Backward) -> list:
    """attention_dkv.wgsl over key blocks (dK, dV): RJ key rows and NCH vec4 columns of each
    per thread; with its loop over queries cut into chunks, a pass adding up their partial
    sums after."""
    plan = sched.options.attention_backward
    (b, s, d, hk, t, dv4), (_, _, bc, br) = (bw.b, bw.s, bw.d, bw.hk, bw.t, bw.dv4), bw.blocks
    stride = dv4 + 1
    bind, names, subs, loaders = _bind_inputs(sched, bw, ["q", "k", "v", "dout"], [bw.n.inputs[i] for i in (0, 1, 2, 4)])
    chunks, per = _chunks(plan, -(-t // bc) * b * hk, -(-s // br))
    partials = {}
    for w, name in ((1, "dk"), (2, "dv")):
        if w in bw.wrt:
            if chunks > 1:
                partials[w] = sched.new_temp()
                bind.use_key(partials[w], write=True)
            else:
                bind.use(bw.wrt[w], write=True, own=True)
            names.append(name)
    ty, tx = min(_lanes(br, dv4), _lanes(bc, dv4)), _lanes(bc, dv4)
    rj, nch = bc // ty, -(-dv4 // tx)
    rn = [(r, c) for r in range(rj) for c in range(nch)]
    ind = " " * 16
    step = "\n".join([f"{ind}let pp{r} = {_at('p_t', 'ii', f'ty * RJ + {r}u')};\n"
                      f"{ind}let sd{r} = {_at('ds_t', 'ii', f'ty * RJ + {r}u')};" for r in range(rj)]
                     + [f"{ind}let ob{c} = {_at('do_t', 'ii', f'min(tx + {tx * c}u, DV4 - 1u)')};\n"
                        f"{ind}let qb{c} = {_at('q_t', 'ii', f'min(tx + {tx * c}u, DV4 - 1u)')};" for c in range(nch)]
                     + [f"{ind}dv{r}_{c} = dv{r}_{c} + pp{r} * ob{c};\n{ind}dk{r}_{c} = dk{r}_{c} + sd{r} * qb{c};"
                        for r, c in rn])
    store = "\n".join(_store_rows(name, rj, nch, tx, dv4, "j0 + ty * RJ", "T", f"(wg.z * {b * hk * t}u + bhk * T + {{row}})"
                                  if partials else "((b * T + {row}) * HK + hk)" if bw.wrt[w] in sched.written
                                  else "(bhk * T + {row})", mul)
                      for w, name, mul in ((1, "dk", " * SCALE"), (2, "dv", "")) if w in bw.wrt)
    decls = bind.decls(names) + f"\n@group(0) @binding({len(names)}) var<storage, read> delta: array<f32>;"
    tile = _score_tile(br // ty, bc // tx, tx, "lse[bh * S + min(qi{r}, S - 1u)]",
                       "delta[bh * S + min(qi{r}, S - 1u)]", True, " " * 12, dv4, plan["unroll_scores"])
    wgsl = render("attention_dkv", BINDINGS=decls, LOADERS=loaders, BC=bc, BR=br, QC=per * br, RT=br // ty, RJ=rj,
                  NT=ty * tx, TX=tx, TILE=tile,
                  KV_TILE=tile_type(bc, stride, True), QD_TILE=tile_type(br, stride, True),
                  P_TILE=tile_type(br, bc, True, "f32"),
                  ACC_DECL="\n".join(f"    var dk{r}_{c} = vec4<f32>(0.0);\n    var dv{r}_{c} = vec4<f32>(0.0);"
                                     for r, c in rn),
                  DKV_STEPS=_steps("ii", br, step, " " * 12, True), STORE=store, **subs, **bw.common)
    dkv = KernelCode(wgsl, (ty * tx, 1, 1), bind.list() + [(bw.delta, "read")], (-(-t // bc), b * hk, chunks),
                     "attention_dkv" + ("/split" if partials else ""))
    if not partials:
        return [dkv]
    size = b * hk * t * d
    dkv.temps = {p: chunks * size * 4 for p in partials.values()}
    return [dkv, _sum_partials(sched, [(p, bw.wrt[w], size) for w, p in partials.items()], chunks, hk, t, d,
                               "attention_dkv/sum")]


def attention_backward(sched: Schedule, k: Kernel) -> list:
    """attention_grad siblings (dQ, dK, dV of one attention) as FlashAttention-2's backward:
    templates/attention_dq.wgsl (dQ, and D = rowsum(dO * O) into a scratch buffer), then
    templates/attention_dkv.wgsl (dK, dV), both recomputing P from the forward's log-sum-exp.
    Outputs that only a head transpose reads are written in its [b, t, h, d] layout."""
    g = sched.graph
    wrt = {g.nodes[r].attr("wrt"): r for r in k.roots}
    n = g.nodes[k.roots[0]]
    (b, h, s, d), (hk, t) = g.nodes[n.inputs[0]].shape, g.nodes[n.inputs[1]].shape[1:3]
    (bq, bk), (bc, br) = backward_blocks(d)
    # fewer workgroups than a large GPU has SMs (132): halve the blocks that count them; with
    # more, the bigger blocks' reuse wins
    bq = 16 if bq == 32 and -(-s // 32) * b * h < 132 else bq
    bc = 16 if bc == 32 and -(-t // 32) * b * hk < 132 else bc
    common = {"S": s, "T": t, "H": h, "HK": hk, "REP": h // hk, "DV4": d // 4, "STR": d // 4 + 1,
              "CAUSAL": str(bool(n.attr("causal"))).lower(), "SCALE": f32_literal(attention_scale(dict(n.attrs), d))}
    bw = _Backward(n, wrt, b, h, s, d, hk, t, (bq, bk, bc, br), sched.new_temp(), common)
    codes = _dq_kernels(sched, bw)
    if 1 not in wrt and 2 not in wrt:
        return codes
    return codes + _dkv_kernels(sched, bw)

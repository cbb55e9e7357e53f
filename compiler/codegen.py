"""WGSL for each scheduled kernel, from the templates in compiler/kernels/.

Shapes are baked into the text as constants: a package is compiled for fixed shapes,
and constant loop bounds let the driver's compiler unroll and fold.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ops import OPS
from .schedule import Kernel, Schedule, base_of, flat_read
from .wgsl import f32_literal, render, template

WG = 256  # threads per workgroup in 1-D kernels
MAX_GROUPS = 65535


@dataclass
class KernelCode:
    wgsl: str
    workgroup_size: tuple
    bindings: list  # [(storage node id or temp key, "read" | "read_write")]
    workgroups: tuple
    label: str
    temps: dict = None  # temp key -> bytes: scratch private to this kernel's dispatches
    variants: dict = None  # device class -> (wgsl, workgroup_size, workgroups): same bindings


def grid(count: int) -> tuple:
    """Workgroups for `count` groups, folded into 2-D past the per-dimension limit."""
    count = max(1, int(count))
    x = min(count, MAX_GROUPS)
    return (x, -(-count // x), 1)


def _strides(shape):
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return list(reversed(out))


def _wtype(dtype):
    return "i32" if dtype == "i32" else "f32"


class _Bindings:
    """Binding slots of one kernel: one per buffer, unless a slot of its own is asked for."""

    def __init__(self, graph, storage):
        self.g, self.storage, self.slots = graph, storage, []  # slots: [storage, access]
        self.shared_from = 0  # slots below this are not shared by later use()s (a GEMM's loads)

    def st(self, i):
        return self.storage.get(i, i)

    def use(self, i, write=False, own=False) -> str:
        s = self.st(i)
        found = [b for b, slot in enumerate(self.slots) if slot[0] == s and b >= self.shared_from]
        if found and not own:
            b = found[0]
        else:
            self.slots.append([s, "read"])
            b = len(self.slots) - 1
        if write:
            self.slots[b][1] = "read_write"
        return f"t{b}"

    def decls(self, names=None) -> str:
        lines = []
        for b, (s, access) in enumerate(self.slots):
            name = names[b] if names else f"t{b}"
            ty = _wtype(self.g.nodes[s].dtype)
            lines.append(f"@group(0) @binding({b}) var<storage, {access}> {name}: array<{ty}>;")
        return "\n".join(lines)

    def list(self):
        return [tuple(slot) for slot in self.slots]


def generate(sched: Schedule, kernel: Kernel) -> KernelCode:
    if kernel.kind == "elementwise":
        return _elementwise(sched, kernel)
    from . import codegen_nn

    kinds = {"matmul": _matmul, "reduce": _reduce, "softmax": _softmax, "norm": _norm,
             "attention": codegen_nn.attention, "conv": codegen_nn.conv,
             "pool": codegen_nn.pool, "gather": codegen_nn.gather}
    return kinds[kernel.kind](sched, kernel)


def per_output(bindings: str, total: int, body: str, prelude: str = "") -> str:
    """WGSL running `body` once per output index `idx` in [0, total)."""
    return render("elementwise", PRELUDE=prelude, BINDINGS=bindings, TOTAL=total, COORDS="", BODY=body)


def ew_code(sched: Schedule, members, roots, bind: "_Bindings", given: dict | None = None, names: dict | None = None):
    """WGSL lines computing elementwise `members` at flat index `idx` and storing `roots`.
    `given` maps node ids to expressions already in scope (a matmul's accumulator `v`).
    Returns (coordinate lines, body lines, whether the prelude's helpers are used)."""
    g = sched.graph
    nodes = g.nodes
    given = given or {}
    coords, body, reads, body_coords = {}, [], {}, []
    uses_prelude = False
    # values are named by order of appearance, not node id: the same chain in every layer
    # is one WGSL text, so one kernel and one pipeline (node ids made 12 copies of each)
    names = {} if names is None else names

    def nm(m):
        return names.setdefault(m, f"ev{len(names)}")

    def coord(shape):
        if shape not in coords:
            c = len(coords)
            strides = _strides(shape)
            coords[shape] = [f"c{c}_{a}" for a in range(len(shape))]
            for a, (d, st) in enumerate(zip(shape, strides)):
                body_coords.append(f"    let c{c}_{a} = (idx / {st}u) % {d}u;")
        return coords[shape]

    def operand(m: int, p: int) -> str:
        j = nodes[m].inputs[p]
        b = base_of(g, j)
        if b in given:
            return given[b]
        if nodes[b].op == "const":
            return f32_literal(nodes[b].attr("value"))
        if b in members:
            return nm(b)
        name = bind.use(b)
        if flat_read(g, m, p):
            key = (b, "flat")
            expr = f"{name}[idx]"
        elif nodes[m].op in ("slice", "pad"):
            key, expr = _window_read(nodes[m], nodes[j], coord(nodes[m].shape), name, b)
        else:
            offs = _read_offsets(nodes[m], nodes[j])
            cs = coord(nodes[m].shape)
            terms = [f"{c} * {s}u" for c, s in zip(cs, offs) if s]
            key = (b, tuple(offs))
            expr = f"{name}[{' + '.join(terms) if terms else '0u'}]"
        if key not in reads:
            reads[key] = f"r{len(reads)}"
            body.append(f"    let {reads[key]} = {expr};")
        return reads[key]

    for m in sorted(members):
        n = nodes[m]
        low = OPS[n.op].lowering[1]
        at = dict(n.attrs)
        if isinstance(low, dict):
            low = low[at.get("to", at.get("approximate", "none"))]
        fmt = {"exponent": f32_literal(at["exponent"])} if "exponent" in at else {}
        if "{i_last}" in low:
            fmt["i_last"] = coord(n.shape)[-1]
        expr = low.format(*[operand(m, p) for p in range(len(n.inputs))], **fmt)
        uses_prelude |= "mn_" in expr
        body.append(f"    let {nm(m)}: {_wtype(n.dtype)} = {expr};")
    for r in roots:
        for key in reads:
            if bind.st(key[0]) == bind.st(r) and key[1] != "flat":
                raise RuntimeError(f"kernel writes {r} in place while reading it at other indices")
        body.append(f"    {bind.use(r, write=True)}[idx] = {nm(r)};")
    return body_coords, body, uses_prelude


def _elementwise(sched: Schedule, k: Kernel) -> KernelCode:
    g = sched.graph
    bind = _Bindings(g, sched.storage)
    total = g.nodes[k.roots[0]].size
    coords, body, uses_prelude = ew_code(sched, k.members, k.roots, bind)
    wgsl = render("elementwise", PRELUDE=template("prelude") if uses_prelude else "",
                  BINDINGS=bind.decls(), TOTAL=total, COORDS="\n".join(coords), BODY="\n".join(body))
    label = "+".join(sorted({g.nodes[m].op for m in k.members}))
    return KernelCode(wgsl, (WG, 1, 1), bind.list(), grid(-(-total // WG)), label)


def _window_read(user, inp, cs, name, b):
    """slice reads x[start + c * step]; pad reads x[(c - start) / step] where that lands
    on an element of x, and its fill value elsewhere."""
    starts, steps = user.attr("starts"), user.attr("steps")
    st = _strides(inp.shape)
    key = (b, user.op, starts, steps)
    if user.op == "slice":
        terms = [f"({s0} + i32({c}) * {step}) * {s}" for c, s0, step, s in zip(cs, starts, steps, st) if s]
        return key, f"{name}[u32({' + '.join(terms) if terms else '0'})]"
    key = key + (user.attr("value"),)
    conds, terms = [], []
    for c, s0, step, s, d in zip(cs, starts, steps, st, inp.shape):
        t = f"(i32({c}) - {s0})"
        if step != 1:
            conds.append(f"{t} % {step} == 0")
            t = f"({t} / {step})"
        conds.append(f"{t} >= 0 && {t} < {d}")
        if s:
            terms.append(f"{t} * {s}")
    read = f"{name}[u32(max({' + '.join(terms) if terms else '0'}, 0))]"
    fill = f32_literal(user.attr("value", 0.0)) if inp.dtype == "f32" else str(int(user.attr("value", 0)))
    return key, f"select({fill}, {read}, {' && '.join(conds) if conds else 'true'})"


def _read_offsets(user, inp):
    """Element offsets per coordinate of `user`'s output for reading input `inp`."""
    if user.op == "transpose":
        st = _strides(inp.shape)
        return [st[p] for p in user.attr("perm")]
    shape = inp.shape
    st = _strides(shape)
    lead = len(user.shape) - len(shape)
    out = [0] * lead
    for a, (d, s) in enumerate(zip(shape, st)):
        out.append(0 if d == 1 and user.shape[lead + a] != 1 else s)
    return out


def reduce_split(outer: int, red: int, inner: int, roots: int = 1) -> int:
    """Slices of the reduced axis, each reduced by its own threads before a second pass
    combines them, when one thread (columns) or one workgroup (rows) per output would
    leave the GPU mostly idle walking a long axis (bias and norm-weight gradients: a few
    hundred outputs over thousands of rows, 0.1 ms each, half of a training step)."""
    if _by_rows(red, inner):  # a workgroup per (row, slice), >= 2048 elements each
        if outer * roots >= 256 or red < 4096:
            return 1
        # ~2,000 workgroups: the NaN guard sums whole gradients to one count each (SD-1.5:
        # 14.7 M elements); 64 slices left the H200 at a fifth of its bandwidth
        s = min(-(-2048 // (outer * roots)), red // 2048, 1024)
    else:  # columns: a thread per (output, slice), >= 32 rows each
        if outer * inner * roots >= 32768 or red < 64:
            return 1
        s = min(-(-65536 // (outer * inner * roots)), red // 32, 256)
    s = max(1, s)
    return -(-red // -(-red // s))  # no empty slice


def _by_rows(red: int, inner: int) -> bool:
    """Contiguous runs long enough for a workgroup each (reduce_rows), else a thread per
    output (reduce_cols)."""
    return inner == 1 and red > 64


def _reduce(sched: Schedule, k: Kernel):
    """One reduction, or several of one geometry (the z workgroup index picks which), each
    reading its input through an elementwise prologue computed in its loads. A long axis
    under few outputs is split: partials per slice, then a pass combining them."""
    g = sched.graph
    n = g.nodes[k.roots[0]]
    shape = g.nodes[n.inputs[0]].shape
    axes = sorted(a % len(shape) for a in n.attr("axes"))
    outer = int(np.prod(shape[:axes[0]], dtype=np.int64))
    red = int(np.prod(shape[axes[0]:axes[-1] + 1], dtype=np.int64))
    inner = int(np.prod(shape[axes[-1] + 1:], dtype=np.int64))
    nz = len(k.roots)
    is_max = n.op == "reduce_max"
    init = f32_literal(float("-inf")) if is_max else "0.0"
    combine = "fn combine(a: f32, b: f32) -> f32 { return " + ("max(a, b)" if is_max else "a + b") + "; }"
    label = n.op if nz == 1 else f"{n.op} x{nz}"
    split = reduce_split(outer, red, inner, nz)
    bind = _Bindings(g, sched.storage)
    out_bind = bind if split == 1 else _Bindings(g, sched.storage)
    loads, stores, uses_prelude = _reduce_io(sched, k, bind, out_bind)
    pick_load = _pick("load(which: u32, idx: u32) -> f32", [f"return load{j}(idx);" for j in range(nz)])
    pick_store = _pick("store(which: u32, idx: u32, v: f32)", stores)
    slots = bind.list()
    if split == 1:
        emit, tail = "fn emit(z: u32, s: u32, idx: u32, v: f32) { store(z, idx, v); }", [pick_store]
    else:
        temp = ("temp", next(_temp_ids))
        slots.append((temp, "read_write"))
        emit = (f"@group(0) @binding({len(bind.slots)}) var<storage, read_write> partial: array<f32>;\n"
                "fn emit(z: u32, s: u32, idx: u32, v: f32) { "
                f"partial[(z * {split}u + s) * {outer * inner}u + idx] = v; }}")
        tail = []
    decls = "\n".join([bind.decls(), render("prelude") if uses_prelude else "", combine, *loads, pick_load,
                       *tail, emit])
    holes = {"BINDINGS": decls, "OUTER": outer, "R": red, "S": split, "RS": -(-red // split), "INIT": init,
             "COMBINE": "combine"}
    suffix = "" if split == 1 else "/split"
    if _by_rows(red, inner):
        first = KernelCode(render("reduce_rows", **holes), (64, 1, 1), slots, (*grid(outer * split)[:2], nz),
                           label + suffix)
    else:
        first = KernelCode(render("reduce_cols", INNER=inner, **holes), (WG, 1, 1), slots,
                           (*grid(-(-split * outer * inner // WG))[:2], nz), label + suffix)
    if split == 1:
        return first
    first.temps = {temp: nz * split * outer * inner * 4}
    out_decls = [line.replace(f"@binding({b})", f"@binding({b + 1})", 1)
                 for b, line in enumerate(out_bind.decls().splitlines())]
    decls2 = "\n".join(["@group(0) @binding(0) var<storage, read> partial: array<f32>;", *out_decls, combine,
                        pick_store])
    second = KernelCode(render("reduce_partials", BINDINGS=decls2, OUTPUTS=outer * inner, S=split, INIT=init,
                               COMBINE="combine"),
                        (WG, 1, 1), [(temp, "read")] + out_bind.list(), (*grid(-(-outer * inner // WG))[:2], nz),
                        label + "/combine")
    return [first, second]


def _reduce_io(sched: Schedule, k: Kernel, bind: _Bindings, out_bind: _Bindings):
    """WGSL functions load{j}(idx) (the prologue of reduction j, bindings in `bind`) and the
    store statement of each root (bindings in `out_bind`; the same object for one kernel)."""
    g = sched.graph
    loads, stores, uses_prelude = [], [], False
    for j, r in enumerate(k.roots):
        x = base_of(g, g.nodes[r].inputs[0])
        chain = _chain(g, x, k.members)
        if chain:
            values = {}
            coords, body, prelude = ew_code(sched, chain, [], bind, names=values)
            uses_prelude |= prelude
            loads.append(f"fn load{j}(idx: u32) -> f32 {{\n" + "\n".join(coords + body)
                         + f"\n    return f32({values[x]});\n}}")  # (f32() of an f32 is free; i32 sums count)
        else:
            loads.append(f"fn load{j}(idx: u32) -> f32 {{ return f32({bind.use(x)}[idx]); }}")
        out = out_bind.use(r, write=True)
        stores.append(f"{out}[idx] = {_wtype(g.nodes[r].dtype)}(v);")
    return loads, stores, uses_prelude


def _pick(signature: str, bodies: list) -> str:
    """load(which, idx) / store(which, idx, v): a switch over the z layer's reduction."""
    if len(bodies) == 1:
        return f"fn {signature} {{ {bodies[0]} }}"
    cases = "".join(f"        case {j}u: {{ {b} }}\n" for j, b in enumerate(bodies[:-1]))
    return f"fn {signature} {{\n    switch which {{\n{cases}        default: {{ {bodies[-1]} }}\n    }}\n}}"


def _chain(g, start: int, members: set) -> set:
    """The elementwise prologue of one reduction: the members its input is computed from."""
    out, stack = set(), [start]
    while stack:
        i = stack.pop()
        if i in out or i not in members or g.nodes[i].op in ("reduce_sum", "reduce_max"):
            continue
        out.add(i)
        stack.extend(base_of(g, j) for j in g.nodes[i].inputs)
    return out


def _norm(sched: Schedule, k: Kernel) -> KernelCode:
    g = sched.graph
    r = k.roots[0]
    n = g.nodes[r]
    k_dims = int(n.attr("normalized_ndim", 1))
    d = int(np.prod(n.shape[len(n.shape) - k_dims:], dtype=np.int64))
    rows = n.size // max(d, 1)
    bind = _Bindings(g, sched.storage)
    bind.use(base_of(g, n.inputs[0]), own=True)
    names = ["src"]
    for extra, name in zip(n.inputs[1:], ("w", "b")):
        bind.use(base_of(g, extra), own=True)
        names.append(name)
    bind.use(r, write=True, own=True)
    names.append("dst")
    affine = "y"
    col = f"(c % {d}u)"
    if "w" in names:
        affine = f"y * w[{col}]"
    if "b" in names:
        affine += f" + b[{col}]"
    default_eps = 1e-5 if n.op == "layer_norm" else 1e-6
    wgsl = render("norm", BINDINGS=bind.decls(names), ROWS=rows, D=d, EPS=f32_literal(n.attr("eps", default_eps)),
                  CENTRE="true" if n.op == "layer_norm" else "false", AFFINE=affine)
    return KernelCode(wgsl, (64, 1, 1), bind.list(), grid(rows), n.op)


def _softmax(sched: Schedule, k: Kernel) -> KernelCode:
    g = sched.graph
    r = k.roots[0]
    n = g.nodes[r]
    cols = n.shape[-1]
    rows = n.size // max(cols, 1)
    bind = _Bindings(g, sched.storage)
    bind.use(base_of(g, n.inputs[0]))
    bind.use(r, write=True)
    out = "exp(z) / s" if n.op == "softmax" else "z - log_s"
    if cols <= 32:  # short rows: a thread each, no barriers
        wgsl = render("softmax_small", BINDINGS=bind.decls(["src", "dst"]), ROWS=rows, COLS=cols, OUT_EXPR=out)
        return KernelCode(wgsl, (64, 1, 1), bind.list(), grid(-(-rows // 64)), n.op)
    wgsl = render("softmax", BINDINGS=bind.decls(["src", "dst"]), ROWS=rows, COLS=cols, OUT_EXPR=out)
    return KernelCode(wgsl, (64, 1, 1), bind.list(), grid(rows), n.op)


def _inner(tg: int) -> str:
    """igemm.wgsl's unrolled K step for TG x TG threads."""
    return "\n".join(
        f"        let a{kk} = a_tile[{kk * tg}u + lid.y];\n        let b{kk} = b_tile[{kk * tg}u + lid.x];\n"
        + "\n".join(f"        acc{r} = acc{r} + a{kk}.{c} * b{kk};" for r, c in enumerate("xyzw"))
        for kk in range(16))


INNER = {tg: _inner(tg) for tg in (8, 16)}
def _inner128(bk: int) -> str:
    """igemm128.wgsl's unrolled K step: BK rows of the tiles, 64 multiply-adds each."""
    return "\n".join(
        f"        let a{kk}l = a_tile[{kk * 32}u + lid.y * 2u];\n        let a{kk}h = a_tile[{kk * 32}u + lid.y * 2u + 1u];\n"
        f"        let b{kk}l = b_tile[{kk * 32}u + lid.x * 2u];\n        let b{kk}h = b_tile[{kk * 32}u + lid.x * 2u + 1u];\n"
        + "\n".join(f"        acc{r}l = acc{r}l + a{kk}{'l' if r < 4 else 'h'}.{'xyzw'[r % 4]} * b{kk}l;\n"
                    f"        acc{r}h = acc{r}h + a{kk}{'l' if r < 4 else 'h'}.{'xyzw'[r % 4]} * b{kk}h;" for r in range(8))
        for kk in range(bk))


def _stage128(bk: int, k_contiguous, vec4=(None, None)) -> dict:
    """igemm128.wgsl's staging: BK/8 vec4s of A and of B per thread, loaded into registers
    (the next tile's while this one is multiplied, with GEMM_PLAN["prefetch"]) and stored
    into the tiles after the barrier. `vec4[i]`: operand i is read 16 bytes at a time
    through load_a4 / load_b4, along its rows or columns ("group": the 4 values a tile
    entry holds) or along K ("k": 4 entries' same component, stored one by one)."""
    index, load, store, out = [], [], [], {}
    for op, contiguous, mode in zip("ab", k_contiguous, vec4):
        if mode == "k":
            out[f"{op.upper()}_ORDER"] = "4 k of one row at a time"
            quads = bk // 4
            for j in range(bk // 8):
                e = f"(tid + {256 * j}u)"
                index.append(f"    let {op}q{j} = {e} % {quads}u;\n    let {op}r{j} = {e} / {quads}u;")
                at = (f"row0 + ar{j}, KB + aq{j} * 4u" if op == "a" else f"KB + bq{j} * 4u, col0 + br{j}")
                load.append(f"p{op}{j} = load_{op}4(g, {at});")
                store.append("\n".join(f"        {op}_tile[({op}q{j} * 4u + {c}u) * 32u + {op}r{j} / 4u][{op}r{j} % 4u] = "
                                       f"p{op}{j}.{comp};" for c, comp in enumerate("xyzw")))
            continue
        st = _staging(contiguous and mode is None, "e", bk, 32)
        out[f"{op.upper()}_ORDER"] = st["ORDER"]
        for j in range(bk // 8):
            e = f"(tid + {256 * j}u)"
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
            store.append(f"        {op}_tile[{op}k{j} * 32u + {op}g{j}] = p{op}{j};")
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
    return dict(INDEX="\n".join(index), LOAD_FIRST=first, LOAD_NEXT=nxt, STORE_TILES=store_tiles,
                STAGED=32 * bk, BK=bk, INNER_LOOP=_inner128(bk), PREFETCH_NOTE=note, **out)


ACC128 = "\n".join(f"    var acc{r}{h} = vec4<f32>(0.0);" for r in range(8) for h in "lh")
STORES128 = "\n".join(
    f"    store(g, slice, r + {r}u, c + {4 * (h == 'h') + i}u, acc{r}{h}.{comp});"
    for r in range(8) for h in "lh" for i, comp in enumerate("xyzw"))
_temp_ids = iter(range(1 << 62))


# GEMM shape plan, from bench/gemm_policy.py on the H200 (bench/results): when 64-tiles
# give fewer than `fill` workgroups, a short K (<= `short_k`) takes 32-tiles (4x the
# workgroups, each cheap), a long K keeps 64-tiles and is split into slices of at least
# `slice_min`; either is split further until about `fill` workgroups run.
GEMM_PLAN = {"fill": 256, "short_k": 512, "slice_min": 64, "slice_min_short": 128, "k_fastest_staging": True,
             "big_bk": 16, "prefetch": True,  # 128-tiles: 4096^3 5.44 -> 4.42 ms with both (bench/REJECTED.md)
             "vec4_loads": True, "big_bk_conv": 8, "vec4_small_tiles": True}  # convolutions' im2col loads: 284 us with 8, 307 with 16


def gemm_plan(m: int, n: int, k: int, groups: int, conv: bool = False) -> tuple:
    """(tile, K step, split-K slices) for an M x N x K GEMM repeated `groups` times (`conv`:
    an implicit GEMM whose loads compute im2col windows)."""
    def tiles(t):
        return -(-m // t) * -(-n // t) * groups

    fill = GEMM_PLAN["fill"]
    if tiles(128) >= 256:  # large tiles only when they still fill the GPU
        return 128, GEMM_PLAN["big_bk_conv" if conv else "big_bk"], 1
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


def _vec4_common(common, decls, st, contract, modes, vec4) -> str:
    """igemm_common with the vec4 operands' bindings retyped array<vec4<f32>>, their scalar
    loaders stubbed out and load_a4 / load_b4 added."""
    if not any(modes):
        return common
    decls4, contract4 = decls, dict(contract)
    for op, mode in zip("ab", modes):
        if mode:
            decls4 = decls4.replace(f"var<storage, read> {op}: array<f32>", f"var<storage, read> {op}: array<vec4<f32>>")
            contract4[f"LOAD_{op.upper()}"] = f"    return 0.0;  // read through load_{op}4"
    return render("igemm_common", BINDINGS=decls4, STORE=st, **contract4) + "".join(
        _vec4_loader(op, v[1]) for op, mode, v in zip("ab", modes, vec4) if mode)


def _stage_small(tg: int, k_contiguous, modes) -> dict:
    """igemm.wgsl's staging statements for tile entry `e` of A and of B (see _stage128)."""
    out = {}
    for op, contiguous, mode in zip("ab", k_contiguous, modes):
        i = 8 * " "
        if mode == "k":  # entry e: row e / 4, k quad e % 4
            at = "row0 + e / 4u, k0 + (e % 4u) * 4u" if op == "a" else "k0 + (e % 4u) * 4u, col0 + e / 4u"
            lines = [f"{i}    let v{op} = load_{op}4(g, {at});"] + [
                f"{i}    {op}_tile[((e % 4u) * 4u + {c}u) * TG + e / 16u][(e / 4u) % 4u] = v{op}.{comp};"
                for c, comp in enumerate("xyzw")]
            out[f"{op.upper()}_ORDER"] = "4 k of one row at a time"
        else:
            st = _staging(contiguous and mode is None, "e", 16, tg)
            out[f"{op.upper()}_ORDER"] = st["ORDER"]
            lines = [f"{i}    let {op}k = {st['K']};", f"{i}    let {op}g = {st['G']};"]
            if mode == "group":
                at = "row0 + ag * 4u, k0 + ak" if op == "a" else "k0 + bk, col0 + bg * 4u"
                lines.append(f"{i}    {op}_tile[{op}k * TG + {op}g] = load_{op}4(g, {at});")
            elif op == "a":
                lines.append(f"{i}    a_tile[ak * TG + ag] = vec4<f32>(" + ", ".join(
                    f"load_a(g, row0 + ag * 4u + {c}u, k0 + ak)" for c in range(4)) + ");")
            else:
                lines.append(f"{i}    b_tile[bk * TG + bg] = vec4<f32>(" + ", ".join(
                    f"load_b(g, k0 + bk, col0 + bg * 4u + {c}u)" for c in range(4)) + ");")
        out[f"STAGE_{op.upper()}"] = "\n".join(lines)
    return out


def _vec4_loader(op: str, body: str) -> str:
    args, guard = ("m: u32, k: u32", "m >= M || k >= K") if op == "a" else ("k: u32, n: u32", "k >= K || n >= N")
    return (f"\n\nfn load_{op}4(g: u32, {args}) -> vec4<f32> {{\n    if ({guard}) {{\n        return vec4<f32>(0.0);\n"
            f"    }}\n{body}\n}}\n")


def igemm(bind: "_Bindings", m: int, n: int, k: int, groups: int, load_a: str, load_b: str, store: str,
          label: str, names=("a", "b", "c"), prelude: str = "", k_contiguous=(False, False), vec4=(None, None),
          conv: bool = False, n_load: int = 2, load_prelude: bool = False):
    """Implicit-GEMM kernel(s) from WGSL bodies of load_a(g, m, k), load_b(g, k, n) and
    store(g, m, n, v). Returns one KernelCode, or two with split-K (partials + sum).
    The first `n_load` bindings belong to the loads (A and B, or what prologues computing
    them read), the others to store() (the output, and an epilogue's inputs).
    `k_contiguous`: whether A and B are laid out along K in memory (how to stage them).
    `vec4`: per operand None, or (mode, body of load_a4(g, m, k) / load_b4(g, k, n) -> vec4,
    reading a binding declared array<vec4<f32>>) for the 128-tile kernel (see _stage128).
    `conv`: the loads compute im2col windows (the plan steps K differently)."""
    tile, bk, split = gemm_plan(m, n, k, groups, conv)
    big = tile == 128
    ks = -(-(-(-k // split)) // bk) * bk  # slice length, a multiple of the K step
    split = -(-k // ks)
    contract = dict(M=m, N=n, K=k, SPLIT=split, KS=ks, LOAD_A=load_a, LOAD_B=load_b)
    all_decls = bind.decls(list(names)).splitlines()
    if split == 1:
        decls, st = prelude + "\n".join(all_decls), store
        slots = bind.list()
    else:  # the GEMM kernel writes [slice, g, m, n] partials into a temp buffer
        temp = ("temp", next(_temp_ids))
        slots = bind.list()[:n_load] + [(temp, "read_write")]
        decls = (prelude if load_prelude else "") + "\n".join(all_decls[:n_load]) + \
            f"\n@group(0) @binding({n_load}) var<storage, read_write> partial: array<f32>;"
        st = f"    partial[((slice * {groups}u + g) * {m}u + m) * {n}u + n] = v;"
    common = render("igemm_common", BINDINGS=decls, STORE=st, **contract)
    if big:
        modes = [v[0] if v and GEMM_PLAN["vec4_loads"] else None for v in vec4]
        wgsl = render("igemm128", COMMON=_vec4_common(common, decls, st, contract, modes, vec4), ACC_DECL=ACC128,
                      STORES=STORES128, **_stage128(bk, k_contiguous, modes))
    else:
        modes = [v[0] if v and GEMM_PLAN["vec4_loads"] and GEMM_PLAN["vec4_small_tiles"] else None for v in vec4]
        wgsl = render("igemm", COMMON=_vec4_common(common, decls, st, contract, modes, vec4),
                      INNER_LOOP=INNER[tile // 4], TG=tile // 4, STAGED=4 * tile, **_stage_small(tile // 4, k_contiguous, modes))
    threads = (8, 8, 1) if tile == 32 else (16, 16, 1)
    code = KernelCode(wgsl, threads, slots, (-(-n // tile), -(-m // tile), groups * split), label)
    code.gemm_decls, code.gemm_store = decls, st  # for variants with other main loops
    # CPU rasterisers: same bindings and split, a barrier-free kernel with its own grid
    cpu = render("igemm_cpu", COMMON=common)
    code.variants = {"cpu": (cpu, (8, 8, 1), (-(-n // 32), -(-m // 32), groups * split))}
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


def prologue_load(sched: Schedule, k: Kernel, x: int, at: str, bind: "_Bindings"):
    """When the GEMM-like kernel `k` computes its input `x` in its loads (see
    schedule._gemm_prologue): (WGSL returning x's element at flat index `at`, whether the
    prelude's helpers are used); else None."""
    if x not in k.members or x in k.roots or x == k.product:
        return None
    values = {}
    coords, body, uses_prelude = ew_code(sched, _chain(sched.graph, x, k.members), [], bind, names=values)
    return "\n".join([f"    let idx = {at};"] + coords + body + [f"    return f32({values[x]});"]), uses_prelude


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


def _matmul(sched: Schedule, k: Kernel) -> KernelCode:
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
    loads = []
    for op, i, (s_row, s_col) in (("a", n.inputs[0], ("m", "k")), ("b", n.inputs[1], ("k", "n"))):
        x = base_of(g, i)
        strides = (sam, sak) if op == "a" else (sbk, sbn)
        at = f"off + {s_row} * {strides[0]}u + {s_col} * {strides[1]}u"
        offset = _batch_offset(batch_shape, g.nodes[i].shape, "off")
        prologue = prologue_load(sched, k, x, at, bind)
        if prologue is None:
            names[len(bind.slots)] = op
            bind.use(x, own=True)
            loads.append(offset + f"\n    return {op}[{at}];")
        else:
            loads.append(offset + "\n" + prologue[0])
            load_prelude |= prologue[1]
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
    off_a = _batch_offset(batch_shape, a.shape, "off")
    off_b = _batch_offset(batch_shape, b.shape, "off")
    if "a" not in names:
        pass  # computed by a prologue: nothing to read 16 bytes at a time
    elif sam == 1 and m_ % 4 == 0 and k_ > 0:
        vec4[0] = ("group", off_a + f"\n    return a[(off + m + k * {sak}u) / 4u];")
    elif sak == 1 and k_ % 4 == 0:
        vec4[0] = ("k", off_a + f"\n    return a[(off + m * {sam}u + k) / 4u];")
    if "b" not in names:
        pass
    elif sbn == 1 and n_ % 4 == 0 and k_ > 0:
        vec4[1] = ("group", off_b + f"\n    return b[(off + k * {sbk}u + n) / 4u];")
    elif sbk == 1 and k_ % 4 == 0:
        vec4[1] = ("k", off_b + f"\n    return b[(off + k + n * {sbn}u) / 4u];")
    codes = igemm(bind, m_, n_, k_, batches, load_a, load_b, store, label, names, prelude,
                  k_contiguous=(sak == 1, sbk == 1), vec4=tuple(vec4), n_load=n_load, load_prelude=load_prelude)
    if plain and sak == 1 and sbk == 1 and k_ % 4 == 0:  # both along K in memory: the CPU's dot-product kernel
        first = codes[0] if isinstance(codes, list) else codes
        decls = first.gemm_decls
        decls = decls.replace("var<storage, read> a: array<f32>", "var<storage, read> a: array<vec4<f32>>")
        decls = decls.replace("var<storage, read> b: array<f32>", "var<storage, read> b: array<vec4<f32>>")
        split, ks = _split_of(first.wgsl)
        st = first.gemm_store
        offsets = (_batch_offset(batch_shape, a.shape, "a_el") + "\n" + _batch_offset(batch_shape, b.shape, "b_el")
                   + "\n    let a_off = a_el / 4u;\n    let b_off = b_el / 4u;")
        wgsl = render("mm_dot_cpu", BINDINGS=decls, M=m_, N=n_, K=k_, SPLIT=split, KS=ks, STORE=st, OFFSETS=offsets)
        first.variants = {"cpu": (wgsl, (8, 8, 1), (-(-n_ // 32), -(-m_ // 32), batches * split))}
    return codes


def _split_of(wgsl: str) -> tuple:
    import re

    split = int(re.search(r"const SPLIT: u32 = (\d+)u;", wgsl).group(1))
    ks = int(re.search(r"const KS: u32 = (\d+)u;", wgsl).group(1))
    return split, ks

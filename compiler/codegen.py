"""WGSL for each scheduled kernel, from the templates in compiler/kernels/.

Shapes are baked into the text as constants: a package is compiled for fixed shapes,
and constant loop bounds let the driver's compiler unroll and fold.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .ops import OPS
from .reductions import PARTIALS_BY_ROWS, by_rows, reduce_geometry, reduce_split
from .schedule import MAX_BINDINGS, Kernel, Schedule, base_of, flat_read
from .wgsl import f32_literal, i32_literal, render, template

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


def tile_type(rows: int, cols: int, two_d: bool, item: str = "vec4<f32>") -> str:
    """A workgroup tile's WGSL type: [rows][cols] (two_d: wgpu's bounds checks then clamp each
    index apart, so a loop-invariant one can be hoisted), or flat, rows * cols."""
    return f"array<array<{item}, {cols}>, {rows}>" if two_d else f"array<{item}, {rows * cols}>"


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
    return {"i32": "i32", "f16": "u32"}.get(dtype, "f32")  # f16: two to a u32 (half.wgsl)


class _Bindings:
    """Binding slots of one kernel: one per buffer, unless a slot of its own is asked for.
    Slots below `shared_from` are not handed out again (a GEMM's loads keep theirs, so a
    split-K sum kernel can run the store with the store's bindings alone)."""

    def __init__(self, graph, storage):
        self.g, self.storage, self.slots = graph, storage, []  # slots: [storage, access]
        self.key_types = {}  # slot key that is no node -> its WGSL element type
        self.shared_from = 0

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

    def use_key(self, key, write=False, dtype="f32") -> str:
        """A slot for a buffer that is no node's own (a range of an arena, a temp)."""
        self.key_types[key] = dtype
        found = [b for b, slot in enumerate(self.slots) if slot[0] == key and b >= self.shared_from]
        if not found:
            self.slots.append([key, "read"])
            found = [len(self.slots) - 1]
        if write:
            self.slots[found[0]][1] = "read_write"
        return f"t{found[0]}"

    def decls(self, names=None, loaders=True) -> str:
        """The bindings' declarations, one line each, then (`loaders`) each f16 binding's
        loader name_at (half.wgsl)."""
        lines = []
        for b, (s, access) in enumerate(self.slots):
            name = names[b] if names else f"t{b}"
            ty = _wtype(self.g.nodes[s].dtype) if isinstance(s, int) else self.key_types.get(s, "f32")
            lines.append(f"@group(0) @binding({b}) var<storage, {access}> {name}: array<{ty}>;")
        return "\n".join(lines) + (self.loaders(names, range(len(self.slots))) if loaders else "")

    def loaders(self, names, slots) -> str:
        """half.wgsl's loader for each f16 binding among `slots`."""
        return "".join(render("half", NAME=names[b] if names else f"t{b}") for b in slots
                       if isinstance(self.slots[b][0], int) and self.g.nodes[self.slots[b][0]].dtype == "f16")

    def element(self, i, name: str, at: str) -> str:
        """WGSL reading node `i`'s element `at` from its binding `name` as f32."""
        return f"{name}_at({at})" if self.half(i) else f"{name}[{at}]"

    def element4(self, i, name: str, at: str) -> str:
        """WGSL reading node `i`'s 4 values from 4 `at` (a vec4 index) from its binding `name`,
        once as_vec4 has retyped it."""
        return f"{name}_at4({at})" if self.half(i) else f"{name}[{at}]"

    def half(self, i) -> bool:
        return self.g.nodes[self.st(i)].dtype == "f16"

    def list(self):
        return [tuple(slot) for slot in self.slots]


def as_vec4(decls: str, names) -> str:
    """`decls` with the read-only f32 bindings `names` retyped array<vec4<f32>> (read 16 bytes
    at a time), f16 ones array<vec2<u32>> read through name_at4 (half4.wgsl); one declared
    otherwise is a compiler bug, not a kernel that silently loads wrong."""
    for name in names:
        old, half = f"var<storage, read> {name}: array<f32>;", f"var<storage, read> {name}: array<u32>;"
        if old in decls:
            decls = decls.replace(old, f"var<storage, read> {name}: array<vec4<f32>>;")
        elif half in decls:
            decls = decls.replace(half, f"var<storage, read> {name}: array<vec2<u32>>;").replace(
                render("half", NAME=name), render("half4", NAME=name))
        else:
            raise RuntimeError(f"no read-only f32 or f16 binding {name!r} to read 4 values at a time")
    return decls


def generate(sched: Schedule, kernel: Kernel) -> KernelCode:
    if kernel.kind == "elementwise":
        return _elementwise(sched, kernel)
    from . import codegen_attention, codegen_gemm, codegen_nn

    kinds = {"matmul": codegen_gemm.matmul, "reduce": _reduce, "count_nonfinite": _count_nonfinite,
             "softmax": _softmax, "norm": _norm,
             "attention": codegen_attention.attention, "conv": codegen_nn.conv,
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
        fmt = {k: f32_literal(at[k]) for k in ("exponent", "keep", "take", "eps") if k in at}
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
    # only the coordinates something reads: a kernel's text then holds no sizes it does not use
    # (AdamW's updates of differently shaped parameters differ only in their length)
    text = "\n".join(body)
    body_coords = [line for line in body_coords if re.search(rf"\b{line.split()[1]}\b", text)]
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
        terms = [f"({i32_literal(s0)} + i32({c}) * {i32_literal(step)}) * {i32_literal(s)}"
                 for c, s0, step, s in zip(cs, starts, steps, st) if s]
        return key, f"{name}[u32({' + '.join(terms) if terms else '0'})]"
    key = key + (user.attr("value"),)
    conds, terms = [], []
    for c, s0, step, s, d in zip(cs, starts, steps, st, inp.shape):
        t = f"(i32({c}) - {i32_literal(s0)})"
        if step != 1:
            conds.append(f"{t} % {i32_literal(step)} == 0")
            t = f"({t} / {i32_literal(step)})"
        conds.append(f"{t} >= 0 && {t} < {i32_literal(d)}")
        if s:
            terms.append(f"{t} * {i32_literal(s)}")
    # (select() evaluates both sides: the read is clamped into the tensor even where it is not used)
    read = f"{name}[min(u32(max({' + '.join(terms) if terms else '0'}, 0)), {max(inp.size, 1) - 1}u)]"
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


def _reduce(sched: Schedule, k: Kernel):
    """One reduction, or several of one geometry (the z workgroup index picks which), each
    reading its input through an elementwise prologue computed in its loads. A long axis
    under few outputs is split: partials per slice, then a pass combining them."""
    g = sched.graph
    n = g.nodes[k.roots[0]]
    outer, red, inner, wrap = reduce_geometry(g.nodes[n.inputs[0]].shape, n.attr("axes"))
    nz = len(k.roots)
    is_max = n.op == "reduce_max"
    label = n.op if nz == 1 else f"{n.op} x{nz}"
    split = reduce_split(outer, red, inner, nz)
    bind = _Bindings(g, sched.storage)
    out_bind = bind if split == 1 else _Bindings(g, sched.storage)
    loads, stores, uses_prelude = _reduce_io(sched, k, bind, out_bind)
    # the templates walk [outer, red]; around a kept run, (output, reduced element) lies elsewhere
    at = f"((idx % {red}u) / {wrap}u) * {outer * wrap}u + (idx / {red}u) * {wrap}u + idx % {wrap}u" if wrap else "idx"
    loads.append(_pick("load(which: u32, idx: u32) -> f32", [f"return load{j}({at});" for j in range(nz)]))
    return _reduction((outer, red, inner, nz, split), is_max, bind, out_bind, loads, stores, uses_prelude, label)


# tensors (or arena ranges) per counting pass: with its output (or, split, its partial sums)
# and one binding to spare, within the storage bindings a kernel may use
COUNT_GROUP = MAX_BINDINGS - 2
COUNT_SLICE = 2048  # elements per workgroup of a counting pass, at least


def _count_nonfinite(sched: Schedule, k: Kernel):
    """The NaN guard's count of non-finite elements over several tensors (a step's gradients),
    as sums over their elements one after the other: a pass (two when split) per
    COUNT_GROUP bindings, not a reduction each (686 for SD-1.5). Gradients placed in an
    arena (compiler/arenas.py) are read as ranges of it, one binding for each run of them
    with no padding between. The count ignores order, so each tensor is read as it lies;
    several passes add up theirs."""
    g = sched.graph
    (r,) = k.roots
    spans = []  # [binding key, first element, end]
    placement = getattr(sched, "placement", {})
    for x in g.nodes[r].inputs:
        s, size = sched.storage.get(base_of(g, x), base_of(g, x)), g.nodes[x].size
        if size:
            arena, at = placement.get(s, (None, 0))
            if spans and arena is not None and spans[-1][0] == arena and at == spans[-1][2]:
                spans[-1][2] = at + size  # the next tensor of the arena (padding, never written, is not read)
            else:
                spans.append([arena if arena is not None else s, at, at + size])
    groups, elements = [[]], 0
    for span in spans:  # elements are indexed by u32 across a pass: under 2^31
        size = span[2] - span[1]
        if len(groups[-1]) == COUNT_GROUP or (groups[-1] and elements + size >= 1 << 31):
            groups.append([])
            elements = 0
        groups[-1].append(span)
        elements += size
    if len(groups) == 1:
        return _count_pass(sched, groups[0], lambda b: f"{b.use(r, write=True)}[idx] = v;")
    counts = ("temp", next(_temp_ids))
    codes = []
    for j, group in enumerate(groups):
        out = _count_pass(sched, group, lambda b, j=j: f"{b.use_key(counts, write=True)}[{j}u + idx] = v;")
        codes.extend(out if isinstance(out, list) else [out])
    codes[0].temps = {**(codes[0].temps or {}), counts: 4 * len(groups)}
    bind = _Bindings(g, sched.storage)
    partial = bind.use_key(counts)
    total = " + ".join(f"{partial}[{j}u]" for j in range(len(groups)))
    store = f"    {bind.use(r, write=True)}[idx] = {total};"
    codes.append(KernelCode(per_output(bind.decls(), 1, store), (WG, 1, 1), bind.list(), (1, 1, 1),
                            "count_nonfinite/sum"))
    return codes


def _count_pass(sched, spans, store):
    """One count over `spans` ([binding key, first element, end]), stored by `store(bindings)`."""
    g = sched.graph
    bind = _Bindings(g, sched.storage)
    pieces, start = [], 0
    for key, lo, end in spans:
        name = bind.use_key(("view", key, lo, end - lo)) if isinstance(key, tuple) else bind.use(key)
        pieces.append((start, start + end - lo, name))
        start += end - lo
    lines = [f"    if (idx < {end}u) {{ return mn_nonfinite({name}[idx - {lo}u]); }}" for lo, end, name in pieces[:-1]]
    if pieces:
        lo, _, name = pieces[-1]
        lines.append(f"    return mn_nonfinite({name}[idx - {lo}u]);")
    else:
        lines.append("    return 0.0;")
    load = "fn load(which: u32, idx: u32) -> f32 {\n" + "\n".join(lines) + "\n}"
    red = max(start, 1)
    # one count over up to millions of elements: a workgroup per COUNT_SLICE of them (up to 8,192;
    # reduce_split's ~2,000 workgroups of 64 threads left SD-1.5's 3.4 GB at 0.5 TB/s)
    split = 1 if red < 2 * COUNT_SLICE else min(red // COUNT_SLICE, 8192)
    split = -(-red // -(-red // split))  # no empty slice
    out_bind = bind if split == 1 else _Bindings(g, sched.storage)
    return _reduction((1, red, 1, 1, split), False, bind, out_bind, [load], [store(out_bind)], True,
                      f"count_nonfinite x{len(pieces)}")


# reduce_rows' tree over a workgroup's 64 partials, a step per width (wgpu bounds a loop, and the
# driver keeps a bounded loop of barriers rolled)
ROWS_TREE = "\n".join(f"    if (lid < {w}u) {{\n        part[lid] = combine(part[lid], part[lid + {w}u]);\n    }}\n"
                      "    workgroupBarrier();" for w in (32, 16, 8, 4, 2))


def _reduction(geometry, is_max, bind, out_bind, loads, stores, uses_prelude, label):
    """The kernel(s) of `nz` reductions of [outer, red, inner] over axis 1, given their
    load(which, idx) functions and store statements; `split` > 1: partials, then a pass
    combining them."""
    outer, red, inner, nz, split = geometry
    init = f32_literal(float("-inf")) if is_max else "0.0"
    combine = "fn combine(a: f32, b: f32) -> f32 { return " + ("max(a, b)" if is_max else "a + b") + "; }"
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
    decls = "\n".join([bind.decls(), render("prelude") if uses_prelude else "", combine, *loads, *tail, emit])
    holes = {"BINDINGS": decls, "OUTER": outer, "R": red, "S": split, "RS": -(-red // split), "INIT": init,
             "COMBINE": "combine", "TREE": ROWS_TREE}
    suffix = "" if split == 1 else "/split"
    if by_rows(red, inner):
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
    outputs = outer * inner
    if outputs * nz < PARTIALS_BY_ROWS:  # few outputs of many slices: reduce_rows over [outputs, slices]
        load = (f"fn load(which: u32, idx: u32) -> f32 {{ return partial[(which * {split}u + idx % {split}u) "
                f"* {outputs}u + idx / {split}u]; }}")
        emit = "fn emit(z: u32, s: u32, idx: u32, v: f32) { store(z, idx, v); }"
        second = KernelCode(render("reduce_rows", BINDINGS="\n".join([decls2, load, emit]), OUTER=outputs, R=split,
                                   S=1, RS=split, INIT=init, COMBINE="combine", TREE=ROWS_TREE),
                            (64, 1, 1), [(temp, "read")] + out_bind.list(), (*grid(outputs)[:2], nz), label + "/combine")
    else:
        second = KernelCode(render("reduce_partials", BINDINGS=decls2, OUTPUTS=outputs, S=split, INIT=init,
                                   COMBINE="combine"),
                            (WG, 1, 1), [(temp, "read")] + out_bind.list(), (*grid(-(-outputs // WG))[:2], nz),
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


_temp_ids = iter(range(1 << 62))  # temp buffers' keys, unique per compile

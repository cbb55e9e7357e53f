"""WGSL for each scheduled kernel, from the templates in compiler/codegen/templates/.

Shapes are baked into the text as constants: a package is compiled for fixed shapes,
and constant loop bounds let the driver's compiler unroll and fold.
"""
from __future__ import annotations


import numpy as np

from ..passes.reductions import PARTIALS_BY_ROWS, by_rows, reduce_geometry, reduce_split
from ..passes.records import MAX_BINDINGS, Kernel, Schedule, base_of
from . import attention, gemm, nn
from .common import WG, Bindings, KernelCode, ew_code, grid, per_output, prologue_chain, wgsl_type
from .wgsl import f32_literal, render, template


def generate(sched: Schedule, kernel: Kernel) -> KernelCode:
    if kernel.kind == "elementwise":
        return _elementwise(sched, kernel)
    kinds = {"matmul": gemm.matmul, "reduce": _reduce, "count_nonfinite": _count_nonfinite,
             "softmax": _softmax, "norm": _norm,
             "attention": attention.attention, "conv": nn.conv,
             "pool": nn.pool, "gather": nn.gather}
    return kinds[kernel.kind](sched, kernel)


def _elementwise(sched: Schedule, k: Kernel) -> KernelCode:
    g = sched.graph
    bind = Bindings(sched)
    total = g.nodes[k.roots[0]].size
    coords, body, uses_prelude = ew_code(sched, k.members, k.roots, bind)
    wgsl = render("elementwise", PRELUDE=template("prelude") if uses_prelude else "",
                  BINDINGS=bind.decls(), TOTAL=total, COORDS="\n".join(coords), BODY="\n".join(body))
    label = "+".join(sorted({g.nodes[m].op for m in k.members}))
    return KernelCode(wgsl, (WG, 1, 1), bind.list(), grid(-(-total // WG)), label)


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
    bind = Bindings(sched)
    out_bind = bind if split == 1 else Bindings(sched)
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
    arena (passes/arenas.py) are read as ranges of it, one binding for each run of them
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
    counts = sched.new_temp()
    codes = []
    for j, group in enumerate(groups):
        out = _count_pass(sched, group, lambda b, j=j: f"{b.use_key(counts, write=True)}[{j}u + idx] = v;")
        codes.extend(out if isinstance(out, list) else [out])
    codes[0].temps = {**(codes[0].temps or {}), counts: 4 * len(groups)}
    bind = Bindings(sched)
    partial = bind.use_key(counts)
    total = " + ".join(f"{partial}[{j}u]" for j in range(len(groups)))
    store = f"    {bind.use(r, write=True)}[idx] = {total};"
    codes.append(KernelCode(per_output(bind.decls(), 1, store), (WG, 1, 1), bind.list(), (1, 1, 1),
                            "count_nonfinite/sum"))
    return codes


def _count_pass(sched, spans, store):
    """One count over `spans` ([binding key, first element, end]), stored by `store(bindings)`."""
    bind = Bindings(sched)
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
    # one count over up to millions of elements: a workgroup per COUNT_SLICE of them (up to 8,192:
    # reduce_split's ~2,000 leave bandwidth unused over gigabytes of gradients; bench/REJECTED.md:
    # long reductions in fewer workgroups)
    split = 1 if red < 2 * COUNT_SLICE else min(red // COUNT_SLICE, 8192)
    split = -(-red // -(-red // split))  # no empty slice
    out_bind = bind if split == 1 else Bindings(sched)
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
        temp = bind.sched.new_temp()
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


def _reduce_io(sched: Schedule, k: Kernel, bind: Bindings, out_bind: Bindings):
    """WGSL functions load{j}(idx) (the prologue of reduction j, bindings in `bind`) and the
    store statement of each root (bindings in `out_bind`; the same object for one kernel)."""
    g = sched.graph
    loads, stores, uses_prelude = [], [], False
    for j, r in enumerate(k.roots):
        x = base_of(g, g.nodes[r].inputs[0])
        chain = prologue_chain(g, x, k.members)
        if chain:
            values = {}
            coords, body, prelude = ew_code(sched, chain, [], bind, names=values)
            uses_prelude |= prelude
            loads.append(f"fn load{j}(idx: u32) -> f32 {{\n" + "\n".join(coords + body)
                         + f"\n    return f32({values[x]});\n}}")  # (f32() of an f32 is free; i32 sums count)
        else:
            loads.append(f"fn load{j}(idx: u32) -> f32 {{ return f32({bind.use(x)}[idx]); }}")
        out = out_bind.use(r, write=True)
        stores.append(f"{out}[idx] = {wgsl_type(g.nodes[r].dtype)}(v);")
    return loads, stores, uses_prelude


def _pick(signature: str, bodies: list) -> str:
    """load(which, idx) / store(which, idx, v): a switch over the z layer's reduction."""
    if len(bodies) == 1:
        return f"fn {signature} {{ {bodies[0]} }}"
    cases = "".join(f"        case {j}u: {{ {b} }}\n" for j, b in enumerate(bodies[:-1]))
    return f"fn {signature} {{\n    switch which {{\n{cases}        default: {{ {bodies[-1]} }}\n    }}\n}}"


def _norm(sched: Schedule, k: Kernel) -> KernelCode:
    g = sched.graph
    r = k.roots[0]
    n = g.nodes[r]
    k_dims = int(n.attr("normalized_ndim", 1))
    d = int(np.prod(n.shape[len(n.shape) - k_dims:], dtype=np.int64))
    rows = n.size // max(d, 1)
    bind = Bindings(sched)
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
    bind = Bindings(sched)
    bind.use(base_of(g, n.inputs[0]))
    bind.use(r, write=True)
    out = "exp(z) / s" if n.op == "softmax" else "z - log_s"
    if cols <= 32:  # short rows: a thread each, no barriers
        wgsl = render("softmax_small", BINDINGS=bind.decls(["src", "dst"]), ROWS=rows, COLS=cols, OUT_EXPR=out)
        return KernelCode(wgsl, (64, 1, 1), bind.list(), grid(-(-rows // 64)), n.op)
    wgsl = render("softmax", BINDINGS=bind.decls(["src", "dst"]), ROWS=rows, COLS=cols, OUT_EXPR=out)
    return KernelCode(wgsl, (64, 1, 1), bind.list(), grid(rows), n.op)



"""What every kernel generator shares: the kernel record, binding slots, workgroup grids,
and elementwise expressions (an elementwise kernel's body, a GEMM's epilogue and prologue)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ...runtime.device import CPU_LANES
from ..ir.ops import OPS
from ..passes.records import Schedule, base_of, flat_read
from .wgsl import f32_literal, i32_literal, render

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



def strides_of(shape):
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return list(reversed(out))



def wgsl_type(dtype):
    return {"i32": "i32", "f16": "u32"}.get(dtype, "f32")  # f16: two to a u32 (half.wgsl)



class Bindings:
    """Binding slots of one kernel: one per buffer, unless a slot of its own is asked for.
    Slots below `shared_from` are not handed out again (a GEMM's loads keep theirs, so a
    split-K sum kernel can run the store with the store's bindings alone)."""

    def __init__(self, sched: Schedule):
        self.sched = sched
        self.g, self.storage, self.slots = sched.graph, sched.storage, []  # slots: [storage, access]
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
            ty = wgsl_type(self.g.nodes[s].dtype) if isinstance(s, int) else self.key_types.get(s, "f32")
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



# CPU rasterisers' variants run on devices whose subgroups are CPU_LANES wide (lavapipe on
# 256-bit SIMD; runtime/device.py picks them): there a read loops over the lanes even when
# they all read one address, so a value every lane needs is read once, by one lane, and
# broadcast (bench/results/2026-12-03-cpu-subgroup-broadcast.md)


def shared_loads(name: str, load: str, count: int, lane: str, indent: str = "        ") -> list:
    """WGSL lines defining {name}0 .. {name}{count - 1}, values every lane of a CPU subgroup
    needs: lane l reads values l, l + 8, ... (`load` formatted with the index), then each is
    broadcast from the lane that read it. Every lane must run these lines (uniform control flow)."""
    own = -(-count // CPU_LANES)
    lines = [f"{indent}let {name}_own{p} = {load.format(f'min({lane} + {CPU_LANES * p}u, {count - 1}u)')};"
             for p in range(own)]
    return lines + [f"{indent}let {name}{c} = subgroupBroadcast({name}_own{c // CPU_LANES}, {c % CPU_LANES}u);"
                    for c in range(count)]


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



def per_output(bindings: str, total: int, body: str, prelude: str = "") -> str:
    """WGSL running `body` once per output index `idx` in [0, total)."""
    return render("elementwise", PRELUDE=prelude, BINDINGS=bindings, TOTAL=total, COORDS="", BODY=body)



def ew_code(sched: Schedule, members, roots, bind: "Bindings", given: dict | None = None, names: dict | None = None):
    """WGSL lines computing elementwise `members` at flat index `idx` and storing `roots`.
    `given` maps node ids to expressions already in scope (a matmul's accumulator `v`).
    Returns (coordinate lines, body lines, whether the prelude's helpers are used)."""
    g = sched.graph
    nodes = g.nodes
    given = given or {}
    coords, body, reads, body_coords = {}, [], {}, []
    uses_prelude = False
    # values are named by order of appearance, not node id: the same chain in every layer
    # is one WGSL text, so one kernel and one pipeline (named by node id, each layer's would differ)
    names = {} if names is None else names

    def nm(m):
        return names.setdefault(m, f"ev{len(names)}")

    def coord(shape):
        if shape not in coords:
            c = len(coords)
            strides = strides_of(shape)
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
            v = nodes[b].attr("value")
            return f"i32({int(v)})" if nodes[b].dtype == "i32" else f32_literal(v)
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
            low = low[at.get("to", at.get("approximate", at.get("kind", "none")))]
        fmt = {k: f32_literal(at[k]) for k in ("exponent", "keep", "take", "eps") if k in at}
        if "{i_last}" in low:
            fmt["i_last"] = coord(n.shape)[-1]
        expr = low.format(*[operand(m, p) for p in range(len(n.inputs))], **fmt)
        uses_prelude |= "mn_" in expr
        body.append(f"    let {nm(m)}: {wgsl_type(n.dtype)} = {expr};")
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



def _window_read(user, inp, cs, name, b):
    """slice reads x[start + c * step]; pad reads x[(c - start) / step] where that lands
    on an element of x, and its fill value elsewhere."""
    starts, steps = user.attr("starts"), user.attr("steps")
    st = strides_of(inp.shape)
    key = (b, user.op, starts, steps)
    if user.op == "slice":
        terms = [f"({i32_literal(s0)} + i32({c}) * {i32_literal(step)}) * {i32_literal(s)}"
                 for c, s0, step, s in zip(cs, starts, steps, st) if s]
        return key, f"{name}[u32({' + '.join(terms) if terms else '0'})]"
    key = key + (user.attr("value"),)
    conds, terms = [], []
    for c, s0, step, s, d in zip(cs, starts, steps, st, inp.shape):
        t = f"(i32({c}) - {i32_literal(s0)})"
        if step != 1:  # (c - start) / step, on u32 values shifted by a multiple of |step|
            t = _stepped(c, s0, step)
            conds.append(f"({c} + {_shift(s0, step) - s0}u) % {abs(step)}u == 0u")
        conds.append(f"{t} >= 0 && {t} < {i32_literal(d)}")
        if s:
            terms.append(f"{t} * {i32_literal(s)}")
    # (select() evaluates both sides: the read is clamped into the tensor even where it is not used)
    read = f"{name}[min(u32(max({' + '.join(terms) if terms else '0'}, 0)), {max(inp.size, 1) - 1}u)]"
    fill = f32_literal(user.attr("value", 0.0)) if inp.dtype == "f32" else str(int(user.attr("value", 0)))
    return key, f"select({fill}, {read}, {' && '.join(conds) if conds else 'true'})"



def _shift(s0: int, step: int) -> int:
    """The smallest multiple of |step| that is at least `s0`."""
    return -(-s0 // abs(step)) * abs(step)


def _stepped(c: str, s0: int, step: int) -> str:
    """WGSL for (c - s0) / step where |step| divides it, from u32 arithmetic only: NVIDIA's
    driver got i32 % and / wrong (by negative divisors, and a pad's gradient with positive steps
    read wrong elements on the H200)."""
    a, off = abs(step), _shift(s0, step)
    q = f"(i32(({c} + {off - s0}u) / {a}u) - {i32_literal(off // a)})"
    return f"(-{q})" if step < 0 else q

def _read_offsets(user, inp):
    """Element offsets per coordinate of `user`'s output for reading input `inp`."""
    if user.op == "transpose":
        st = strides_of(inp.shape)
        return [st[p] for p in user.attr("perm")]
    shape = inp.shape
    st = strides_of(shape)
    lead = len(user.shape) - len(shape)
    out = [0] * lead
    for a, (d, s) in enumerate(zip(shape, st)):
        out.append(0 if d == 1 and user.shape[lead + a] != 1 else s)
    return out



def prologue_chain(g, start: int, members: set) -> set:
    """The elementwise prologue of one reduction: the members its input is computed from."""
    out, stack = set(), [start]
    while stack:
        i = stack.pop()
        if i in out or i not in members or g.nodes[i].op in ("reduce_sum", "reduce_max"):
            continue
        out.add(i)
        stack.extend(base_of(g, j) for j in g.nodes[i].inputs)
    return out

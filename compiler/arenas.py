"""Trainable parameters, their gradients and their optimizer state laid out one after
another in shared buffers ("arenas"): the optimizer then updates a whole group of
parameters in one kernel, and the NaN guard reads a group's gradients as ranges of one
buffer (one range where their sizes leave no padding between them).

A group holds parameters in graph order, each at a 256-byte aligned offset (WebGPU's
largest minStorageBufferOffsetAlignment). Each column of a group (the parameters, each
optimizer state, the gradients) is one buffer with that same layout, so element i of the
group is the same element of one parameter in every column. Parameters and states are
persistent buffers; a group's gradient arena is scratch, pooled like any tensor from its
first gradient's kernel to the update. Its padding is never written, so it holds whatever
the pool left there: the count skips it, and the widened update writes what it computes
from it only into padding, which nothing reads.

Every other kernel sees no difference: a tensor placed in an arena is bound at its offset.
"""
from __future__ import annotations

import re

from ..runtime.package import OFFSET_ALIGN
from .ir import NAMED_LEAVES

ARENAS = True  # False: every parameter, gradient and state in buffers of their own (bench A/B)
ARENA_BYTES = 128 << 20  # most per group
# groups a model's parameters make at most (unless ARENA_BYTES makes more), and the bytes of a
# group at least. Larger groups mean fewer kernels but pack worse into the scratch pool, whose
# buffers are whole (offline, train dispatches / buffer MiB without groups -> 32 groups of
# >= 4 MiB -> 128 of >= 1 MiB: SmolLM2 2858 / 2495 -> 2556 / 2750 -> 2670 / 2554; DINOv2
# 1510 / 370 -> 1272 / 391 -> 1341 / 371; SD-1.5 4896 / 15191 -> 4554 / 15448 at 128)
GROUPS = 128
SMALLEST = 1 << 20
ALIGN = OFFSET_ALIGN // 4  # elements: the runtime's offset alignment, 256 bytes


def padded(elements: int) -> int:
    """Elements a tensor takes in its arena: up to the next 256-byte boundary."""
    return -(-elements // ALIGN) * ALIGN


def layout(sizes: dict) -> tuple:
    """Groups of parameter names (in the order given): about GROUPS of them, within
    [SMALLEST, ARENA_BYTES] bytes unless one parameter alone is larger. A group's gradients
    take their arena from the first one's kernel to the update, so a group's size is also
    what training holds beyond the gradients themselves. Parameters of one element stay
    out: an update kernel reads a one-element parameter and a scalar alike."""
    sizes = {n: size for n, size in sizes.items() if size > 1} if ARENAS else {}
    total = sum(padded(size) * 4 for size in sizes.values())
    limit = min(ARENA_BYTES, max(SMALLEST, -(-total // GROUPS)))
    groups, cur, used = [], [], 0
    for name, size in sizes.items():
        need = padded(size) * 4
        if cur and used + need > limit:
            groups.append(tuple(cur))
            cur, used = [], 0
        cur.append(name)
        used += need
    if cur:
        groups.append(tuple(cur))
    return tuple(groups)


def offsets(names, sizes) -> tuple:
    """({name: element offset}, elements spanned) of one group."""
    out, at = {}, 0
    for name in names:
        out[name] = at
        at += padded(sizes[name])
    end = max((out[n] + sizes[n] for n in names), default=0)
    return out, end


def plan_leaves(graphs) -> tuple:
    """Leaf name -> (arena, element offset), and arena -> elements, for the parameters and
    optimizer states of every graph that has groups. An arena is (column, group): column
    "param" or the state's suffix ("exp_avg", "exp_avg_sq", "momentum")."""
    place, spans = {}, {}
    for g in graphs:
        if not g.arenas or any(n in place for chunk in g.arenas for n in chunk):
            continue
        params, states = g.params, g.leaves("state")
        for c, names in enumerate(g.arenas):
            sizes = {n: g.nodes[params[n]].size for n in names}
            offs, span = offsets(names, sizes)
            columns = {"param": {n: n for n in names}}
            for n in names:
                shape = g.nodes[params[n]].shape
                for s in states:  # optimizer.<name>.<suffix> of the parameter's shape
                    suffix = s[len(n) + 11:]
                    if s.startswith(f"optimizer.{n}.") and "." not in suffix and g.nodes[states[s]].shape == shape:
                        columns.setdefault(suffix, {})[n] = s
            for column, leaf in columns.items():
                if len(leaf) != len(names):
                    continue  # a state only some parameters have stays in its own buffers
                key = (column, c)
                spans[key] = span
                for n, leaf_name in leaf.items():
                    place[leaf_name] = (key, offs[n])
    return place, spans


def place(sched, leaf_place: dict, leaf_spans: dict) -> None:
    """sched.placement: storage -> (arena, element offset) for this program's placed leaves
    and, where it has groups, its gradients; sched.arena_elements: arena -> elements;
    sched.arena_offsets: parameter arena -> the offsets of the parameters planned in it
    (by whichever program planned them: another program may train only some of them).

    A parameter's gradient is the one tensor of its size that its update kernel reads
    besides leaves. The first parameter reading a shared one (two parameters' gradients
    can be one node after common subexpressions) places it; the other's update kernel
    then reads it at that parameter's offset, and its group is not widened. An output
    stays out. A kernel reading one tensor of an arena and writing another gets that
    binding declared read_write too (PackageBuilder._dispatch): WebGPU refuses a buffer
    both read and written in one dispatch."""
    g, storage = sched.graph, sched.storage
    nodes = g.nodes
    placement, spans = {}, {}
    sched.arena_offsets = {}
    for name, (arena, off) in leaf_place.items():
        if arena[0] == "param":
            sched.arena_offsets.setdefault(arena, set()).add(off)
    for op in ("param", "state"):
        for name, i in g.leaves(op).items():
            if name in leaf_place:
                placement[i] = leaf_place[name]
                spans[leaf_place[name][0]] = leaf_spans[leaf_place[name][0]]
    if g.arenas and all(n in leaf_place for chunk in g.arenas for n in chunk):
        writer = {}
        for k in sched.kernels:
            for r in k.roots:
                writer[storage.get(r, r)] = k
        outputs = {storage.get(o, o) for o in g.outputs.values()}
        params = g.params
        for names in g.arenas:
            for n in names:
                p = params[n]
                arena, off = leaf_place[n]
                k = writer.get(p)
                if k is None or k.kind != "elementwise":
                    continue
                vec = {storage.get(x, x) for x in k.reads if nodes[x].size == nodes[p].size}
                vec = {s for s in vec if nodes[s].op not in NAMED_LEAVES}
                if len(vec) != 1:
                    continue
                (s,) = vec
                if s in placement or s in outputs or s not in writer:
                    continue
                key = ("grad", arena[1])
                placement[s] = (key, off)
                spans[key] = leaf_spans[arena]
    sched.placement, sched.arena_elements = placement, spans


def merge_updates(codes: list, placement: dict, spans: dict, offsets_of: dict, is_scalar, grid, wg: int) -> list:
    """`codes` with each group's per-parameter update kernels (the same WGSL but for their
    length; every binding placed at the parameter's offset, or one element) replaced by one
    kernel over the whole group, where the last of them ran: when each parameter planned in
    the group has exactly one such kernel (the widened one runs over all of its elements)."""
    from .codegen import KernelCode

    groups = {}
    for j, code in enumerate(codes):
        sig = _update_signature(code, placement, is_scalar)
        if sig is not None:
            groups.setdefault(sig, []).append(j)
    drop, put = set(), {}
    for (wgsl, bindings, arena), members in groups.items():
        offsets = [_param_offset(codes[j], placement) for j in members]
        if len(members) < 2 or len(set(offsets)) != len(offsets) or set(offsets) != offsets_of.get(arena):
            continue
        lo, hi = members[0], members[-1]
        mine = set(members)
        wrote = {_where(s, placement) for j in members for s, a in codes[j].bindings if a == "read_write"}
        read = {_where(s, placement) for j in members for s, a in codes[j].bindings if a == "read"}
        if any(j not in mine and any(_where(s, placement) in wrote or (a == "read_write" and _where(s, placement) in read)
                                     for s, a in codes[j].bindings) for j in range(lo, hi)):
            continue  # something between them touches what they update
        span = spans[arena]
        put[hi] = KernelCode(wgsl.replace(_TOTAL, f"idx >= {span}u)", 1), codes[lo].workgroup_size,
                             list(bindings), grid(-(-span // wg)), f"{codes[lo].label} x{len(members)}")
        drop |= mine
    return [put.get(j, c) for j, c in enumerate(codes) if j not in drop or j in put]


_TOTAL = "idx >= TOTAL)"


def _param_offset(code, placement) -> int:
    return next(placement[s][1] for s, _ in code.bindings if s in placement and placement[s][0][0] == "param")


def _where(s, placement):
    return placement[s][0] if s in placement else s


def _update_signature(code, placement, is_scalar):
    """(WGSL with its length taken out, bindings as arenas, the group's parameter arena) of
    an elementwise kernel updating one placed parameter; None for any other kernel."""
    placed = [placement[s] for s, _ in code.bindings if s in placement]
    params = [(arena, off) for arena, off in placed if arena[0] == "param"]
    if len(params) != 1 or code.temps or code.variants or code.wgsl.count("idx >= ") != 1:
        return None
    (arena, off), = params
    if any(o != off or a[1] != arena[1] for a, o in placed) or \
            any(s not in placement and not is_scalar(s) for s, _ in code.bindings):
        return None
    # coordinates (per the parameter's shape) may be computed, for scalars read at [0u], but
    # not used: every tensor is read element for element
    lines = [line for line in code.wgsl.split("\n") if not _COORD.match(line)]
    wgsl = "\n".join(lines)
    if _COORD_USE.search(wgsl):
        return None
    start = wgsl.find("idx >= ")
    wgsl = wgsl[:start] + _TOTAL + wgsl[wgsl.find(")", start) + 1:]
    return wgsl, tuple((_where(s, placement), a) for s, a in code.bindings), arena


_COORD = re.compile(r"\s*let c\d+_\d+ = ")
_COORD_USE = re.compile(r"\bc\d+_\d+\b")

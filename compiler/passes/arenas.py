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

from ..ir.graph import NAMED_LEAVES
from ..ir.groups import padded


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
        by_param = _states_by_param(states)
        for c, names in enumerate(g.arenas):
            sizes = {n: g.nodes[params[n]].size for n in names}
            offs, span = offsets(names, sizes)
            columns = {"param": {n: n for n in names}}
            for n in names:
                shape = g.nodes[params[n]].shape
                for suffix, s in by_param.get(n, ()):  # optimizer.<name>.<suffix> of the parameter's shape
                    if g.nodes[states[s]].shape == shape:
                        columns.setdefault(suffix, {})[n] = s
            for column, leaf in columns.items():
                if len(leaf) != len(names):
                    continue  # a state only some parameters have stays in its own buffers
                key = (column, c)
                spans[key] = span
                for n, leaf_name in leaf.items():
                    place[leaf_name] = (key, offs[n])
    return place, spans


def _states_by_param(states) -> dict:
    """Parameter name -> [(suffix, state name)] for the states named optimizer.<name>.<suffix>."""
    out = {}
    for s in states:
        if s.startswith("optimizer.") and "." in s[10:]:
            name, suffix = s[10:].rsplit(".", 1)
            out.setdefault(name, []).append((suffix, s))
    return out


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



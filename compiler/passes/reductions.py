"""Reductions as kernels see them: the [outer, reduced, inner] geometry of a reduction (axes
around one kept run included), how a long one is split into slices and combined, and the
merging of reductions of one geometry into one dispatch."""
from __future__ import annotations

import math

from .records import MAX_BINDINGS, base_of


def reduce_split(outer: int, red: int, inner: int, roots: int = 1) -> int:
    """Slices of the reduced axis, each reduced by its own threads before a second pass
    combines them, when one thread (columns) or one workgroup (rows) per output would
    leave the GPU mostly idle walking a long axis (bias and norm-weight gradients: a few
    hundred outputs over thousands of rows, which unsplit take much of a training step)."""
    if by_rows(red, inner):  # a workgroup per (row, slice), >= 2048 elements each
        if red < 4096:
            return 1
        # ~2,000 workgroups for long rows (batch norm's statistics over [16, 256, 56, 56] are 256
        # rows of 50,176): fewer leave the GPU's bandwidth unused (bench/REJECTED.md: long
        # reductions in fewer workgroups)
        s = min(-(-2048 // (outer * roots)), red // 2048, 1024)
    else:  # columns: a thread per (output, slice), >= 32 rows each
        if outer * inner * roots >= 32768 or red < COLUMNS_SPLIT_FROM:
            return 1
        s = min(-(-65536 // (outer * inner * roots)), red // 32, 256)
    s = max(1, s)
    return -(-red // -(-red // s))  # no empty slice


# column reductions over fewer rows than this run unsplit: one pass, a thread per output
# (bench/REJECTED.md: column reductions over up to 512 rows unsplit)
COLUMNS_SPLIT_FROM = 64

# below this many outputs, a split reduction's combining pass is reduce_rows over the slices (a
# workgroup per output): one thread summing a thousand partials is slow (bench/REJECTED.md: long
# reductions in fewer workgroups)
PARTIALS_BY_ROWS = 128


def by_rows(red: int, inner: int) -> bool:
    """Contiguous runs long enough for a workgroup each (reduce_rows), else a thread per
    output (reduce_cols)."""
    return inner == 1 and red > 64


def reduce_geometry(shape, axes) -> tuple | None:
    """(outer, reduced, inner, wrap) of a reduction over `axes` as one kernel runs it, or None
    when it takes several (prepare() splits it). Adjacent axes: [outer, reduced, inner], wrap 0.
    Axes around one run of kept ones (batch norm's (0, 2, 3) of NCHW): outer = the kept run's
    elements, reduced = all the others, inner = 1, and the reduced element r of output o lies
    at (r / wrap) * outer * wrap + o * wrap + r % wrap (wrap: the elements after the kept run)."""
    rank = len(shape)
    axes = sorted(a % rank for a in axes)
    if not axes:
        return None
    if axes == list(range(axes[0], axes[-1] + 1)):
        return math.prod(shape[:axes[0]]), math.prod(shape[axes[0]:axes[-1] + 1]), math.prod(shape[axes[-1] + 1:]), 0
    kept = [a for a in range(rank) if a not in axes]
    if kept != list(range(kept[0], kept[-1] + 1)):
        return None
    wrap = math.prod(shape[kept[-1] + 1:])
    return math.prod(shape[kept[0]:kept[-1] + 1]), math.prod(shape[:kept[0]]) * wrap, 1, wrap


def geometry_of(graph, r):
    """(op, outer, reduced, inner, wrap) of a reduction node: equal geometries share a kernel."""
    n = graph.nodes[r]
    return (n.op, *reduce_geometry(graph.nodes[n.inputs[0]].shape, n.attr("axes")))


def merge_kept_reductions(graph, kernels, waits=None):
    """Reductions of one geometry over values that stay in memory until the optimizer
    anyway (tensors that an in-place update reads, e.g. bias gradients' sums of one
    size) run as one dispatch, one reduction per workgroup layer: no tensor lives
    longer for it. (Merging others would keep an activation gradient alive for a layer.)
    `waits`: kernel -> the kernels it waits for without reading them (schedule's `after`);
    two reductions, one of which waits for the other that way, stay apart."""

    assigned = {base_of(graph, v) for v in graph.assigns.values()}
    kernel_of = {r: i for i, k in enumerate(kernels) for r in k.roots}
    kept = set()
    for k in kernels:
        if k.kind == "elementwise" and assigned & set(k.roots):
            kept |= k.reads
    if not kept:
        return kernels, kernel_of
    deps = [({kernel_of[x] for x in k.reads if x in kernel_of} | (waits or {}).get(i, set())) - {i}
            for i, k in enumerate(kernels)]
    anc = [None] * len(kernels)  # kernel -> bitset of the kernels it waits for, transitively
    path = set()  # kernels whose waits are being resolved: one of them waited for again is a cycle
    for start in range(len(kernels)):
        stack = [start]
        while stack:  # (kernel indices are not a topological order: a root may join an older kernel)
            i = stack[-1]
            if anc[i] is not None:
                stack.pop()
                continue
            todo = [j for j in deps[i] if anc[j] is None]
            if todo:
                if path.intersection(todo):
                    raise RuntimeError(f"compiler bug: kernels wait for each other in a cycle ({kernels[i].kind} "
                                       f"kernel {i}); please report it with the model")
                path.add(i)
                stack.extend(todo)
                continue
            bits = 0
            for j in deps[i]:
                bits |= (1 << j) | anc[j]
            anc[i] = bits
            path.discard(i)
            stack.pop()
    groups = {}
    for i, k in enumerate(kernels):
        if k.kind == "reduce" and len(k.roots) == 1 and k.reads and k.reads <= kept:
            groups.setdefault(geometry_of(graph, k.roots[0]), []).append(i)
    gone = set()
    for same in groups.values():
        head, group, merged = None, [], 0
        for i in same:
            k = kernels[i]
            if head is not None and len(kernels[head].reads | k.reads) + len(kernels[head].roots) + 1 <= MAX_BINDINGS \
                    and not anc[i] & merged and not any((anc[j] >> i) & 1 for j in group):
                h = kernels[head]
                h.roots += k.roots
                h.members |= k.members
                h.reads |= k.reads
                gone.add(i)
                group.append(i)
                merged |= 1 << i
                anc[head] |= anc[i]
            else:
                head, group, merged = i, [i], 1 << i
    if not gone:
        return kernels, kernel_of
    kept_kernels = [k for i, k in enumerate(kernels) if i not in gone]
    return kept_kernels, {r: i for i, k in enumerate(kept_kernels) for r in k.roots}

"""3. Order: kernels in a topological order, in-place writers after the readers of the old
values, with what a kernel waits for without reading it (schedule's `after`); runs of
kernels sunk next to their readers (CompileOptions.sink_chains)."""
from __future__ import annotations

def waits_of(kernels, kernel_of, after) -> dict:
    """Kernel -> the kernels it waits for without reading them (schedule's `after`)."""
    if not after:
        return {}
    of = {**kernel_of, **{k.product: i for i, k in enumerate(kernels) if k.product is not None}}
    out = {}
    for i, k in enumerate(kernels):
        for r in set(k.roots) | k.members | k.epilogue:
            if r in after and of.get(after[r], i) != i:
                out.setdefault(i, set()).add(of[after[r]])
    return out


def order_kernels(graph, kernels, kernel_of, inplace, sink_chains: bool, waits=None):
    """Topological order of kernels; in-place writers after the readers of old values.

    The order is that of repeated passes over the pending kernels in index order, each
    taking every kernel whose dependencies are done: a kernel goes in pass
    max(pass of each dependency, plus one for a dependency scanned after it). Computed
    in one topological walk instead of the passes themselves (quadratic at 8,000 kernels)."""
    n = len(kernels)
    deps = [set() for _ in range(n)]
    for k, ker in enumerate(kernels):
        for j in ker.reads:
            if j in kernel_of and kernel_of[j] != k:
                deps[k].add(kernel_of[j])
        deps[k] |= (waits or {}).get(k, set())
    readers = {leaf: [] for leaf in inplace.values()}
    for k, ker in enumerate(kernels):
        for j in ker.reads:
            if j in readers:
                readers[j].append(k)
    for root, leaf in inplace.items():
        w = kernel_of[root]
        deps[w].update(k for k in readers[leaf] if k != w)  # write-after-read
    users = [[] for _ in range(n)]
    waiting = [len(d) for d in deps]
    for k, d in enumerate(deps):
        for j in d:
            users[j].append(k)
    pass_of = [1] * n
    ready = [k for k in range(n) if not waiting[k]]
    for k in ready:  # grows while walking
        for u in users[k]:
            pass_of[u] = max(pass_of[u], pass_of[k] + (k > u))
            waiting[u] -= 1
            if not waiting[u]:
                ready.append(u)
    if len(ready) < n:
        pending = sorted(set(range(n)) - set(ready))
        raise RuntimeError(f"scheduler found a cycle between kernels (a compiler bug): {len(pending)} kernels wait, "
                           f"the first writing nodes {', '.join(str(kernels[k].roots) for k in pending[:4])}")
    order = sorted(range(n), key=lambda k: (pass_of[k], k))
    waiters = {}  # kernel -> the kernels waiting for it without reading it
    for k, ks in (waits or {}).items():
        for j in ks:
            waiters.setdefault(j, set()).add(k)
    return _sink_chains(graph, kernels, kernel_of, order, users, waiters) if sink_chains else order


# CompileOptions.sink_chains: move a kernel, with the producers that only it reads, down to
# just before its first reader (or in-place writer) when every other tensor they read is read
# there or later anyway, so that no lifetime grows. The backward's recomputed forward values
# otherwise run early in kernel order and are held, every layer's at once, until their
# layer's turn (bench/results/2026-11-30-h200-sink-chains-on.md against -off.md: less memory,
# the same speed).
SINK_CHAIN_LENGTH = 8  # kernels moved together at most


def _sink_chains(graph, kernels, kernel_of, order, users, waiters=None) -> list:
    persistent = {i for i, n in enumerate(graph.nodes) if n.op in ("input", "param", "state", "constant", "const")}
    readers = {}
    for k in order:
        for x in kernels[k].reads:
            readers.setdefault(x, set()).add(k)
    key = {k: float(i) for i, k in enumerate(order)}
    moved = 0

    def chain(k, target, group):
        """Adds k, and the producers only the group reads, to `group`; False if a tensor
        some member reads would then live longer."""
        group.add(k)
        for x in kernels[k].reads:
            if x in persistent or any(key[r] >= target for r in readers[x] - group):
                continue
            p = kernel_of.get(x)
            if p is None or p in group or len(group) >= SINK_CHAIN_LENGTH \
                    or any(readers.get(r, set()) - group - {k} for r in kernels[p].roots):
                return False
            if not chain(p, target, group):
                return False
        return True

    for k in reversed(order):  # readers first: a kernel's target is where its readers now are
        if not users[k]:
            continue
        target = min(key[u] for u in users[k])
        group = set()
        if target <= key[k] + 1 or not chain(k, target, group):
            continue
        if waiters and any(key[w] < target for p in group for w in waiters.get(p, set()) - group):
            continue  # (a kernel waiting for a member would run before it)
        for member in sorted(group, key=key.__getitem__, reverse=True):  # keep their order
            moved += 1
            key[member] = target - 1e-6 * moved
    return sorted(order, key=key.__getitem__)


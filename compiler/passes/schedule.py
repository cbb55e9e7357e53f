"""Scheduling: which nodes become which kernels, in what order, in which buffers.

1. Elementwise nodes whose users all read them element for element are inlined into
   their users' expressions; every other value is materialized (a "root").
2. Elementwise roots of equal size merge into multi-output kernels when no other
   kernel lies between them (the optimizer's m, v and weight update become one).
3. Kernels are ordered topologically; a kernel that overwrites a parameter in place
   (an optimizer update) comes after every kernel that reads the old value.
4. Buffers: leaves are persistent; the rest share a pool by liveness, per program.
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.ops import OPS
from ..options import DEFAULT, CompileOptions
from .records import MAX_BINDINGS, Kernel, Schedule, base_of, flat_read, is_elementwise, readers_of
from .order import order_kernels, waits_of
from .reductions import merge_kept_reductions

# inputs an op's kernel reads through (batch, head, token) strides: a [b, t, h, d] -> [b, h, t, d]
# transpose in front of them needs no kernel (attention's q, k, v; its gradient's dO too)
STRIDED_READS = {"attention": (0, 1, 2), "attention_lse": (0, 1, 2), "attention_grad": (0, 1, 2, 3, 4)}
# ops whose kernel can write its output in [b, t, h, d] layout, so that the transpose back to
# it (the only other reader being strided reads, which then read that layout) needs no kernel
STRIDED_WRITES = ("attention", "attention_grad")
# kernel kinds that compute several outputs from the same inputs: nodes of such a kind with equal
# inputs and attributes (but `wrt`) share one kernel (attention and its log-sum-exp; dQ, dK, dV)
SIBLING_KINDS = ("attention",)


def schedule(graph: Graph, options: CompileOptions = DEFAULT, after: dict | None = None) -> Schedule:
    """The kernels that compute `graph`, in order, and where each value is stored.

    `after`: node -> a node whose kernel its kernel waits for without reading it (a value the
    backward recomputes waits for the backward work before it: passes/remat.py); such a
    kernel never merges with one that the waited-for node depends on."""
    after = after or {}
    users = graph.users()
    live = set(graph.live_nodes())
    pinned = {base_of(graph, i) for i in list(graph.outputs.values()) + list(graph.assigns.values())}
    inlined = _inline(graph, users, live, pinned)
    fitted = _fit_bindings(graph, live, inlined)
    views, written = _strided_views(graph, users, live, pinned, inlined)
    kernels = _group(graph, live, inlined, fitted, views, written, after)
    _keep_in_registers(graph, kernels, users, live, pinned)
    kernels, kernel_of = _fuse_epilogues(graph, kernels, users, live, pinned, after)
    kernels, kernel_of = merge_kept_reductions(graph, kernels, waits_of(kernels, kernel_of, after))
    storage, inplace = _storage(graph, live, kernels, kernel_of, written)
    order = order_kernels(graph, kernels, kernel_of, inplace, options.sink_chains, waits_of(kernels, kernel_of, after))
    return Schedule(graph, storage, [kernels[k] for k in order], inlined, views, written, options=options)


def _inline(graph, users, live, pinned) -> set:
    """1. Elementwise nodes read element for element by elementwise users only (or cheap to
    recompute in each reader, or a reduction's prologue) become part of their readers."""
    nodes = graph.nodes
    inlined = set()
    recompute = _recomputable(graph, live, pinned)
    for i in sorted(live, reverse=True):
        n = nodes[i]
        if not is_elementwise(n.op) or i in pinned or n.op == "const":
            continue
        readers = readers_of(graph, i, users, live)
        ok = readers and all(is_elementwise(nodes[u].op) and flat_read(graph, u, p) for u, p in readers)
        cheap = len({u for u, _ in readers}) == 1 or _cheap(graph, i) or i in recompute
        if (ok and cheap) or _reduce_prologue(graph, i, readers, i in recompute):
            inlined.add(i)
    return inlined


def _fit_bindings(graph, live, inlined) -> dict:
    """A fused chain must fit the device's bindings: inner nodes are materialized (taken out
    of `inlined`) until it does. Returns root -> (members, external reads).

    A chain is looked at again only once a node of it was materialized: rescanning every
    chain per pass is quadratic in an SD-size training step."""
    nodes = graph.nodes
    holders = {}  # inlined node -> roots whose members held it then
    fitted = {}  # root -> (members, external reads) as last computed
    dirty = set(live)
    changed = True
    while changed:
        changed = False
        for r in sorted(live):
            if r not in dirty:
                continue
            dirty.discard(r)
            if r in inlined or not (is_elementwise(nodes[r].op) or _is_reduce(nodes[r].op)) or nodes[r].op == "const":
                continue
            members = _members(graph, r, inlined)
            for m in members:
                holders.setdefault(m, set()).add(r)
            reads = _external_reads(graph, members)
            fitted[r] = members, reads  # current once the loop ends: a change re-dirties its holders
            if len(reads) + 1 > MAX_BINDINGS and len(members) > 1:
                inner = sorted(members - {r}, key=lambda i: len(_external_reads(graph, _members(graph, i, inlined))))
                inlined.discard(inner[-1])
                dirty.add(inner[-1])
                dirty.update(holders[inner[-1]])
                changed = True
    return fitted


def _head_transpose(n) -> bool:
    return n.op == "transpose" and len(n.shape) == 4 and tuple(n.attr("perm")) == (0, 2, 1, 3)


def _strided_views(graph, users, live, pinned, inlined) -> tuple:
    """Transposes that need no kernel: `views`, a [b, t, h, d] -> [b, h, t, d] transpose read
    only through strides (attention's q, k, v) -> its input; `written`, an op that writes its
    output in the transposed layout itself -> the transpose back."""
    nodes = graph.nodes
    views = {}
    for i in sorted(live):
        n = nodes[i]
        if _head_transpose(n) and i not in pinned and i not in inlined:
            readers = [(u, p) for u in users[i] if u in live for p, j in enumerate(nodes[u].inputs) if j == i]
            if readers and all(p in STRIDED_READS.get(nodes[u].op, ()) for u, p in readers):
                views[i] = base_of(graph, n.inputs[0])
    written = {}
    for i in sorted(live):
        n = nodes[i]
        src = n.inputs[0] if n.inputs else None
        if _head_transpose(n) and i not in views and i not in pinned and i not in inlined \
                and nodes[src].op in STRIDED_WRITES and src not in pinned and src not in written:
            readers = readers_of(graph, src, users, live)
            if all((u, p) == (i, 0) or p in STRIDED_READS.get(nodes[u].op, ()) for u, p in readers):
                written[src] = i
    return views, written


def _group(graph, live, inlined, fitted, views, written, after) -> list:
    """2. Every materialized value (a root) into a kernel, in index order: an elementwise root
    joins a kernel whose output it reads, or that reads what it reads (horizontal merges),
    where no third kernel lies between them; siblings (attention and its log-sum-exp) share one."""
    nodes = graph.nodes
    aliases = {**views, **{t: w for w, t in written.items()}}  # kernels reading these wait for the writer
    for x in list(aliases):  # a view of a written transpose waits for the writer of the two
        while aliases[x] in aliases:
            aliases[x] = aliases[aliases[x]]
    leaf_of = {nodes[i].attr("name"): i for i in live if nodes[i].op in ("param", "state")}
    inplace_of = {base_of(graph, v): leaf_of[name] for name, v in graph.assigns.items() if name in leaf_of}
    grouping = _Grouping(graph, inplace_of, after)
    for r in sorted(live):
        if nodes[r].op in ("input", "param", "state", "constant", "const", "reshape") or r in inlined or r in aliases:
            continue
        if r in fitted:
            members, reads = fitted[r]
        else:
            fused = is_elementwise(nodes[r].op) or _is_reduce(nodes[r].op)
            members = _members(graph, r, inlined) if fused else {r}
            reads = _external_reads(graph, members)
        grouping.place(r, members, {aliases.get(x, x) for x in reads})
    return [k for k in grouping.kernels if k.roots]  # (absorbed ones are empty)


class _Grouping:
    """Kernels as roots are placed, with each kernel's dependencies kept as a transitively
    closed bitset (anc_k) so that a merge never makes a cycle.

    users_k: kernel index -> kernels reading its outputs (directly, or taken over from a
    merged kernel): whoever has bit k in anc_k is reachable from k there. The closure
    follows these instead of testing every kernel per join or merge; whatever adds to
    anc_k keeps them in step."""

    def __init__(self, graph, inplace_of, after=None):
        self.graph, self.nodes, self.inplace_of = graph, graph.nodes, inplace_of
        self.after = after or {}  # node -> a node its kernel waits for (schedule's `after`)
        self.waits = []  # kernel -> what its nodes' `after` depend on, as anc_k bits
        self.kernels, self.kernel_of, self.anc_k, self.users_k = [], {}, [], []
        self.siblings = {}  # (kind, inputs, attributes) -> kernel, for SIBLING_KINDS
        self.sharing = {}  # stored value -> elementwise kernels of its size reading it (horizontal merges)
        self.leaf_readers = {leaf: set() for leaf in inplace_of.values()}  # leaf written in place -> its readers

    def bits_of(self, j) -> int:
        """What reading materialized value j depends on."""
        k = self.kernel_of.get(j)
        return 0 if k is None else (1 << k) | self.anc_k[k]

    def n_bindings(self, reads, roots) -> int:
        """Bindings of a kernel: an in-place update reads and writes one buffer, one binding."""
        return len({self.inplace_of.get(x, x) for x in reads} | {self.inplace_of.get(x, x) for x in roots})

    def _joinable(self, r, members, ext, waits=0):
        """An elementwise kernel whose output `r` reads and can join, unless another input
        (or what `r` waits for) depends on that kernel."""
        graph, nodes, kernels = self.graph, self.nodes, self.kernels
        for j in sorted(ext, reverse=True):
            k = self.kernel_of.get(j)
            if k is None or kernels[k].kind != "elementwise" or nodes[kernels[k].roots[0]].size != nodes[r].size:
                continue
            other = waits
            for x in ext:
                if self.kernel_of.get(x) != k:
                    other |= self.bits_of(x)
            if (other >> k) & 1:
                continue
            if not all(flat_read(graph, m, p) for m in members
                       for p, x in enumerate(nodes[m].inputs) if base_of(graph, x) in kernels[k].roots):
                continue  # a thread only holds the other outputs at its own index
            if self.n_bindings(kernels[k].reads | ext, kernels[k].roots + [r]) > MAX_BINDINGS:
                continue
            return k
        return None

    def read_before(self, *roots) -> int:
        """What the readers of the old values that `roots` overwrite in place depend on: an
        in-place write runs after them, so its kernel cannot be one of those (a reader in
        the writer's own kernel reads first, at its own index)."""
        out = 0
        for r in roots:
            for q in self.leaf_readers.get(self.inplace_of.get(r), ()):
                out |= self.anc_k[q]
        return out

    def overwrites_for_readers_of(self, kt, kb, b, target) -> bool:
        """Would kernels `target` and `b` merged overwrite in place a value that a third kernel
        waiting for one of them still reads (a cycle)?"""
        before = self.read_before(*kt.roots, *kb.roots)
        return bool((before >> b) & 1 or (before >> target) & 1)

    def place(self, r, members, ext) -> None:
        n = self.nodes[r]
        elementwise = is_elementwise(n.op)
        anchors = [self.after[m] for m in members | {r} if m in self.after]
        waits = 0
        for a in anchors:
            waits |= self.bits_of(a)
        target = self._joinable(r, members, ext, waits | self.read_before(r)) if elementwise else None
        dep = waits
        for x in ext:
            dep |= self.bits_of(x)
        sib = None
        if not elementwise and OPS[n.op].lowering[1] in SIBLING_KINDS:
            sib = (OPS[n.op].lowering[1], n.inputs, tuple(a for a in n.attrs if a[0] != "wrt"), self.after.get(r))
            target = self.siblings.get(sib)
        if target is None:
            self.kernels.append(Kernel("elementwise" if elementwise else OPS[n.op].lowering[1], []))
            self.anc_k.append(0)
            self.waits.append(0)
            self.users_k.append(set())
            target = len(self.kernels) - 1
            if sib is not None:
                self.siblings[sib] = target
        k = self.kernels[target]
        k.roots.append(r)
        k.members |= members
        k.reads = (k.reads | ext) - set(k.roots)
        for x in ext:
            if x in self.leaf_readers:
                self.leaf_readers[x].add(target)
        self.kernel_of[r] = target
        self.waits[target] |= waits
        for x in list(ext) + anchors:
            if self.kernel_of.get(x, target) != target:
                self.users_k[self.kernel_of[x]].add(target)
        new = dep & ~(1 << target) & ~self.anc_k[target]
        if new:
            self.anc_k[target] |= new
            for kk in _waiting(self.users_k, target) - {target}:  # keep the closure: whoever waits for target waits for these
                self.anc_k[kk] |= new
        if elementwise:
            for x in ext:
                if self.nodes[x].size == n.size:
                    self.sharing.setdefault(x, set()).add(target)
            self.absorb(target, ext)

    def absorb(self, target, ext) -> None:
        """Other elementwise kernels of the same size join `target` when neither waits for the
        other: those whose outputs it reads, and those reading the same stored tensor (AdamW's
        m, v and weight updates of one parameter, each reading its gradient, would otherwise be
        2-3 kernels: a root joins only one kernel as it is placed)."""
        graph, nodes, kernels, kernel_of = self.graph, self.nodes, self.kernels, self.kernel_of
        anc_k, users_k, sharing = self.anc_k, self.users_k, self.sharing
        kt = kernels[target]
        candidates = [kernel_of.get(j) for j in sorted(ext, reverse=True)]
        candidates += sorted({k for x in ext for k in sharing.get(x, ())})
        for b in candidates:
            if b is None or b == target or kernels[b].kind != "elementwise" or not kernels[b].roots:
                continue
            kb = kernels[b]
            if nodes[kb.roots[0]].size != nodes[kt.roots[0]].size or _through_other(kernels, kernel_of, anc_k, target, b) \
                    or _through_other(kernels, kernel_of, anc_k, b, target) \
                    or (self.waits[target] >> b) & 1 or (self.waits[b] >> target) & 1 \
                    or self.overwrites_for_readers_of(kt, kb, b, target):
                continue
            roots = set(kt.roots) | set(kb.roots)
            if not all(flat_read(graph, m, p) for m in kt.members | kb.members
                       for p, x in enumerate(nodes[m].inputs) if base_of(graph, x) in roots):
                continue
            if self.n_bindings(kt.reads | kb.reads, kt.roots + kb.roots) > MAX_BINDINGS:
                continue
            kt.roots += kb.roots
            kt.members |= kb.members
            self.waits[target] |= self.waits[b]
            for x in kb.reads:  # what b waited for, target now waits for
                if kernel_of.get(x, target) not in (target, b):
                    users_k[kernel_of[x]].add(target)
            users_k[target] |= users_k[b]
            kt.reads = (kt.reads | kb.reads) - roots
            for x in kb.roots:
                kernel_of[x] = target
            for x in kb.reads:
                if b in sharing.get(x, ()):
                    sharing[x].discard(b)
                    sharing[x].add(target)
                if b in self.leaf_readers.get(x, ()):
                    self.leaf_readers[x].discard(b)
                    self.leaf_readers[x].add(target)
            kb.roots, kb.members, kb.reads = [], set(), set()
            anc_k[target] |= anc_k[b]
            for kk in _waiting(users_k, b, target) - {target}:  # whoever waited for either now waits for the merged kernel
                anc_k[kk] |= (1 << target) | anc_k[target]


def _storage(graph, live, kernels, kernel_of, written) -> tuple:
    """3. Storage: views share their base's buffer; assigns write into their target.
    Returns (node -> the node owning its buffer, in-place root -> the leaf it writes)."""
    nodes = graph.nodes
    storage = {t: w for w, t in written.items()}  # the transpose's layout is the writer's buffer's
    leaves = {nodes[i].attr("name"): i for i, n in enumerate(nodes) if n.op in ("param", "state")}
    inplace = {}
    outputs = {base_of(graph, o) for o in graph.outputs.values()}
    for name, v in graph.assigns.items():
        b = base_of(graph, v)
        if name not in leaves:
            raise ValueError(f"the program assigns {name!r}, which is no parameter or state of it")
        if not (b in kernel_of and kernels[kernel_of[b]].kind == "elementwise") or b in outputs or b in inplace:
            # prepare() puts a copy in front of anything else, so this is a compiler bug
            raise RuntimeError(f"cannot update {name!r} in place (node {b}: {nodes[b].op})")
        storage[b] = leaves[name]
        inplace[b] = leaves[name]
    for i in sorted(live):  # views live in their base's buffer, wherever that is
        if nodes[i].op == "reshape":
            base = base_of(graph, i)
            storage[i] = storage.get(base, base)
    return storage, inplace


def _waiting(users_k, *ks) -> set:
    """`ks` and every kernel waiting for one of them, directly or through others."""
    seen, stack = set(ks), list(ks)
    while stack:
        for u in users_k[stack.pop()] - seen:
            seen.add(u)
            stack.append(u)
    return seen


def _keep_in_registers(graph, kernels, users, live, pinned):
    """A root whose every reader is computed in its own kernel (and nowhere else) needs no
    buffer: AdamW's new m and v, read by the weight update and the NaN guard's select in the
    same kernel, would each be a parameter-sized tensor (226 MB at SmolLM2's tied embedding)."""
    owner = {}
    for k, ker in enumerate(kernels):
        for x in ker.members | set(ker.roots):
            owner.setdefault(x, set()).add(k)
    for k, ker in enumerate(kernels):
        if ker.kind != "elementwise" or len(ker.roots) < 2:
            continue
        keep = []
        for r in ker.roots:
            readers = readers_of(graph, r, users, live)
            if r in pinned or not readers or any(owner.get(u) != {k} for u, _ in readers):
                keep.append(r)
        if keep:
            ker.members |= set(ker.roots)
            ker.roots = keep


def _through_other(kernels, kernel_of, anc_k, k, b) -> bool:
    """Does kernel k wait for kernel b through a third kernel (so merging them would
    make a cycle)? Reading b's outputs directly is fine: the merged kernel has them."""
    for x in kernels[k].reads:
        c = kernel_of.get(x)
        if c is not None and c != b and (anc_k[c] >> b) & 1:
            return True
    return False


def _fuse_epilogues(graph, kernels, users, live, pinned, after=None):
    """A matmul whose product only feeds one elementwise kernel, element for element,
    computes that kernel in its store instead (bias, activation, residual): one dispatch
    and one tensor fewer. With schedule's `after`: not a kernel of late nodes (those
    waiting for others) into a matmul that is not, which would run them early; nor a kernel
    reading what waits for the matmul (a recomputed value waiting for the backward's matmul
    whose product it multiplies), which would make the two wait for each other."""
    nodes = graph.nodes
    late = set(after or ())
    waiting = _kernel_users(kernels, after) if after else None  # kernel -> its readers and waiters
    writer = {r: k for k, ker in enumerate(kernels) for r in ker.roots}
    fused = {}  # elementwise kernel -> the matmul computing it in its store
    owner = {}  # node -> the kernels computing it (several when it is recomputed in each reader)
    for k, ker in enumerate(kernels):
        for r in list(ker.roots) + list(ker.members):
            owner.setdefault(r, set()).add(k if ker.kind == "elementwise" else None)
    assigned = {base_of(graph, v) for v in graph.assigns.values()}
    gone = set()
    for k, ker in enumerate(kernels):
        if ker.kind != "matmul" or len(ker.roots) != 1 or ker.epilogue:
            continue
        m = ker.roots[0]
        if m in pinned:
            continue
        readers = readers_of(graph, m, users, live)
        consumers = set().union(*(owner.get(u, {None}) for u, _ in readers))
        if len(consumers) != 1 or None in consumers:
            continue
        e = consumers.pop()
        ek = kernels[e]
        if e in gone or ek.kind != "elementwise" or any(r in assigned for r in ek.roots):
            continue
        if m not in late and any(r in late for r in ek.roots):
            continue
        if waiting and _reaches(waiting, fused, k, e, {fused.get(writer[x], writer[x]) for x in ek.reads - {m}
                                                       if x in writer}):
            continue
        if not all(u in ek.members and flat_read(graph, u, p) for u, p in readers):
            continue
        if any(nodes[r].size != nodes[m].size for r in ek.roots):
            continue
        if len((ek.reads - {m}) | ker.reads) + len(ek.roots) + 2 > MAX_BINDINGS \
                or (len(ker.members) > 1 and len(ek.reads - {m}) + len(ker.reads) + len(ek.roots) > MAX_BINDINGS):
            continue  # (a prologue's reads have slots of their own: the store never shares them)
        ker.epilogue, ker.product = set(ek.members), m
        ker.roots = list(ek.roots)
        ker.reads = (ker.reads | ek.reads) - {m}
        gone.add(e)
        fused[e] = k
    kept = [ker for i, ker in enumerate(kernels) if i not in gone]
    return kept, {r: i for i, ker in enumerate(kept) for r in ker.roots}


def _kernel_users(kernels, after) -> list:
    """Kernel -> the kernels reading its outputs or waiting for it (schedule's `after`)."""
    of = {r: k for k, ker in enumerate(kernels) for r in ker.roots}
    out = [set() for _ in kernels]
    for k, ker in enumerate(kernels):
        for x in ker.reads:
            if of.get(x, k) != k:
                out[of[x]].add(k)
    for k, ks in waits_of(kernels, of, after).items():
        for w in ks:
            out[w].add(k)
    return out


def _reaches(waiting, fused, start, skip, targets) -> bool:
    """Does kernel `start` lead to one of `targets` other than through kernel `skip`?
    (`waiting`: kernel -> its readers and waiters; `fused`: elementwise kernel -> the matmul
    computing it in its store, the two one kernel now, named by the matmul.)"""
    store = {k: e for e, k in fused.items()}
    seen, stack = {start, skip}, [start]
    while stack:
        k = stack.pop()
        for u in waiting[k] | waiting[store[k]] if k in store else waiting[k]:
            u = fused.get(u, u)
            if u in targets:
                return True
            if u not in seen:
                seen.add(u)
                stack.append(u)
    return False


def _is_reduce(op: str) -> bool:
    return OPS[op].lowering[:2] == ("kernel", "reduce")


def _reduce_prologue(graph, i, readers, recomputable=False) -> bool:
    """An elementwise value read only by one reduction (or, when cheap to recompute, by
    reductions and elementwise kernels) is computed in the reductions' loads (nonfinite
    flags, squares, products summed for a gradient): no tensor, no kernel."""
    if len(readers) == 1:
        return readers[0][1] == 0 and _is_reduce(graph.nodes[readers[0][0]].op)
    return recomputable and all((p == 0 and _is_reduce(graph.nodes[u].op))
                                or (is_elementwise(graph.nodes[u].op) and flat_read(graph, u, p)) for u, p in readers)


RECOMPUTE_OPS = 6  # longest elementwise chain recomputed in each reader instead of stored


def _recomputable(graph, live, pinned) -> dict:
    """Elementwise values cheaper to recompute in every reader than to keep: a short chain
    over ONE stored tensor of their size plus smaller (broadcast) operands and leaves, e.g.
    a batch norm's x - mean, its normalised x, its affine output; AdamW's new moments. Training then keeps the
    convolution's output alive for the backward pass, as PyTorch does, not four copies.
    Returns node -> the stored same-size tensors its chain reads (at most one)."""
    nodes = graph.nodes
    chain, big = {}, {}  # node -> ops recomputed, the stored same-size tensors it reads
    for i in sorted(live):
        n = nodes[i]
        if not is_elementwise(n.op) or n.op in ("const", "transpose", "slice", "pad", "one_hot") or i in pinned:
            continue
        ops, reads = 1, set()
        for j in n.inputs:
            b = base_of(graph, j)
            if nodes[b].size < n.size or nodes[b].op in ("const", "param", "state", "input", "constant"):
                continue  # broadcast operands, and leaves: those stay in memory anyway
            if b in chain:
                ops += chain[b]
                reads |= big[b]
            else:
                reads.add(b)
        if ops <= RECOMPUTE_OPS and len(reads) <= 1 and all(flat_read(graph, i, p) or nodes[base_of(graph, j)].size < n.size
                                                           for p, j in enumerate(n.inputs)):
            chain[i], big[i] = ops, reads
    return {i: big[i] for i in chain}


def _cheap(graph, i):
    """One op over leaves or constants: recomputing it in each reader costs nothing."""
    n = graph.nodes[i]
    return all(graph.nodes[base_of(graph, j)].op in ("const", "input", "param", "state", "constant") for j in n.inputs) \
        and graph.nodes[i].size <= 1


def _members(graph, r, inlined):
    out, stack = set(), [r]
    while stack:
        i = stack.pop()
        if i in out:
            continue
        out.add(i)
        for j in graph.nodes[i].inputs:
            b = base_of(graph, j)
            if b in inlined:
                stack.append(b)
    return out


def _external_reads(graph, members):
    ext = set()
    for i in members:
        for j in graph.nodes[i].inputs:
            b = base_of(graph, j)
            if b not in members and graph.nodes[b].op != "const":
                ext.add(b)
    return ext

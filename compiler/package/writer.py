"""Programs -> one package file: buffers by liveness, deduplicated kernels, weights.

File layout (runtime/package.py reads it; docs/PACKAGE.md describes it):
  MAGIC (8 bytes) | u32 format version | u64 manifest length | manifest (msgpack)
  | u64 blob length | blob (safetensors: parameters and non-zero initial state)
  | sha256 of everything before the blob (32 bytes; the manifest holds the blob's CRC-32s)
"""
from __future__ import annotations

import hashlib
import struct

import msgpack
import numpy as np

from ..codegen import lift_sizes, merge_quick
from ..codegen.arena_updates import merge_updates
from ..codegen.common import WG, KernelCode
from ..codegen.kernels import generate
from ..ir.graph import as_half
from ..options import DEFAULT, CompileOptions
from ..passes import arenas
from . import blob as blobs  # (blobs.CHUNK read at write time: tests vary it)
from ...runtime.package import DTYPES, FORMAT_NAME, FORMAT_VERSION, MAGIC, QUICK
from ..passes.records import Schedule, base_of

VARIANTS_SINCE = {QUICK: 5}  # the format version that first carries a variant (older ones: left out)
ALIGN = 16


def nbytes(node) -> int:
    return bytes_of(node.size, np.dtype(DTYPES[node.dtype]).itemsize)


class PackageBuilder:
    def __init__(self, compiler_version: str, options: CompileOptions = DEFAULT):
        """Programs in, one package file out. `options.share_scratch`: programs draw their
        scratch buffers from one pool; only for packages whose programs never interleave (a
        frame scheduler cutting a training step across frames while inference runs between
        its chunks needs them private)."""
        self.version = compiler_version
        self.options = options
        self.scratch = []  # scratch buffers of the programs added so far
        self.buffers = []  # sizes in bytes
        self.tensors = []  # manifest entries
        self.leaf_tensor = {}  # leaf name -> tensor index
        self.kernels = []
        self.kernel_index = {}  # wgsl text -> kernel index
        self.programs = {}
        self.blob = {}  # name -> ndarray
        self._arrays = {}  # name -> (source value, dtype, array as stored): one conversion per value
        self._early = None  # a Blob predicted by start_blob_hash, checksummed on threads
        self.reservation = None  # the package's bytes, reserved early (compile.py)
        self.max_bindings = 0
        self.max_workgroups = 0
        self.leaf_place, self.leaf_spans = {}, {}  # arenas of parameters and optimizer state
        self.arena_buffer = {}  # their arena -> buffer

    def plan_arenas(self, graphs):
        """Lay out the parameter groups of `graphs` (passes/arenas.py) in shared buffers;
        before add_program, which places each leaf where this put it."""
        place, spans = arenas.plan_leaves([g for g in graphs if not any(
            n in self.leaf_tensor for chunk in g.arenas for n in chunk)])
        self.leaf_place.update(place)
        for key, span in spans.items():
            self.leaf_spans[key] = span
            self.arena_buffer[key] = self._buffer(bytes_of(span))

    def _buffer(self, size: int) -> int:
        self.buffers.append(int(size))
        return len(self.buffers) - 1

    def _leaf(self, node, value) -> int:
        name, role = node.attr("name"), node.op
        if name in self.leaf_tensor:
            t = self.tensors[self.leaf_tensor[name]]
            if tuple(t["shape"]) != node.shape or t["dtype"] != node.dtype:
                raise ValueError(f"{role} {name!r} is {node.dtype}{list(node.shape)} here, "
                                 f"{t['dtype']}{t['shape']} elsewhere (role {t['role']})")
            return self.leaf_tensor[name]
        if name in self.leaf_place:
            arena, at = self.leaf_place[name]
            where = {"buffer": self.arena_buffer[arena], "offset": at * 4}
        else:
            where = {"buffer": self._buffer(nbytes(node))}
        entry = {"name": name, "role": role, "dtype": node.dtype, "shape": list(node.shape), **where, "init": "zeros"}
        if _stored(role, value):
            self.blob[name] = self._array(name, node.dtype, value)
            entry["init"] = "blob"
        elif role in ("param", "constant"):
            raise ValueError(f"parameter {name!r} has no value")
        self.tensors.append(entry)
        self.leaf_tensor[name] = len(self.tensors) - 1
        return self.leaf_tensor[name]

    def _array(self, name, dtype, value):
        hit = self._arrays.get(name)
        if hit is None or hit[0] is not value or hit[1] != dtype:
            stored = as_half(value) if dtype == "f16" else np.ascontiguousarray(value, dtype=DTYPES[dtype])
            hit = (value, dtype, stored)
            self._arrays[name] = hit
        return hit[2]

    def start_blob_hash(self, graphs):
        """Start hashing the weights of the programs that will be added from `graphs`
        (prepared graphs, in the order of add_program), on a thread, while the caller
        schedules them. write() uses that hash when the blob came out as predicted."""
        tensors, seen = dict(self.blob), set(self.leaf_tensor)
        for g in graphs:
            for n in g.nodes:
                name = n.attr("name") if n.op in ("input", "param", "state", "constant") else None
                if name is None or name in seen:
                    continue
                seen.add(name)
                value = g.values.get(name)
                if _stored(n.op, value):
                    tensors[name] = self._array(name, n.dtype, value)
        self._early = blobs.Blob(tensors)
        self._early.start_checksums(self.options.host_switch_interval)

    def add_program(self, name: str, sched: Schedule, extra: dict | None = None):
        """One scheduled program: its kernels, its scratch buffers by liveness, its outputs
        and its dispatch list."""
        g = sched.graph
        if g.arenas:
            self.plan_arenas([g])  # (no-op when compile() planned them with the other programs)
        arenas.place(sched, self.leaf_place, self.leaf_spans)
        codes = self._kernel_codes(sched)
        buffer_of = {}  # storage node id -> buffer
        for i, n in enumerate(g.nodes):
            if n.op in ("input", "param", "state", "constant"):
                buffer_of[i] = self.tensors[self._leaf(n, g.values.get(n.attr("name")))]["buffer"]
        outs = {o: sched.storage.get(base_of(g, i), base_of(g, i)) for o, i in g.outputs.items()}
        peak, arena_buffer = self._place_scratch(sched, codes, buffer_of, outs.values())
        where = _Placement(sched, buffer_of, arena_buffer).where
        outputs = {}
        for oname, s in outs.items():
            n = g.nodes[g.outputs[oname]]
            b, rng = where(s)
            self.tensors.append({"name": oname, "role": "output", "program": name, "dtype": n.dtype,
                                 "shape": list(n.shape), "buffer": b, **({"offset": rng[0]} if rng else {}),
                                 "init": "none", **_source(g, "output", oname)})
            outputs[oname] = len(self.tensors) - 1
        dispatches = [self._dispatch_with_variants(code, where) for code in codes]
        inputs = {n.attr("name"): self.leaf_tensor[n.attr("name")] for n in g.nodes if n.op == "input"}
        for iname, t in inputs.items():
            self.tensors[t].update(_source(g, "input", iname))
        self.programs[name] = {"inputs": inputs, "outputs": outputs, "dispatches": dispatches,
                               "scratch_peak_bytes": int(peak), **(extra or {})}

    def _kernel_codes(self, sched: Schedule) -> list:
        """Every kernel's code in order, a parameter group's update kernels merged into one."""
        g = sched.graph
        codes = []
        for k in sched.kernels:
            c = generate(sched, k)
            codes.extend(c if isinstance(c, list) else [c])
        return merge_updates(codes, sched.placement, sched.arena_elements, sched.arena_offsets,
                             lambda s: isinstance(s, int) and g.nodes[s].size == 1, WG)

    def _place_scratch(self, sched: Schedule, codes: list, buffer_of: dict, outputs) -> tuple:
        """Scratch storage into buffers by liveness, in kernel order (a gradient arena lives
        from its first gradient's kernel on: groups are small, few gradients wait for the
        others); fills `buffer_of`. Returns (peak scratch bytes, arena -> buffer)."""
        g, placement = sched.graph, sched.placement
        temps = {}
        for c in codes:
            temps.update(c.temps or {})

        def pooled(s):  # binding key -> what the scratch pool holds it in (a gradient: its arena)
            if isinstance(s, tuple) and s[0] == "view":
                s = s[1]
            elif s in placement:
                s = placement[s][0]
            return None if s in self.arena_buffer else s

        def size_of(s):
            if s in temps:
                return temps[s]
            return bytes_of(sched.arena_elements[s]) if isinstance(s, tuple) else nbytes(g.nodes[s])
        first, last = {}, {}
        for k, code in enumerate(codes):
            for s, access in code.bindings:
                s = pooled(s)
                if s is None or s in buffer_of:
                    continue
                first.setdefault(s, k)
                last[s] = k
        end = len(codes)
        for s in map(pooled, outputs):
            if s is not None and s not in buffer_of:
                last[s] = end
        placed = _pack_by_lifetime(first, last, size_of, self._buffer, self.buffers,
                                   self.scratch if self.options.share_scratch else [])
        self.scratch = sorted(set(self.scratch) | set(placed.values()))
        buffer_of.update(placed)
        arena_buffer = {**self.arena_buffer, **{s: b for s, b in placed.items() if isinstance(s, tuple)}}
        return _peak(first, last, size_of, end), arena_buffer

    def _dispatch_with_variants(self, code, where) -> dict:
        entry = self._dispatch(code, where)
        for cls, (wgsl, wgs, groups) in (code.variants or {}).items():
            if FORMAT_VERSION < VARIANTS_SINCE.get(cls, 0):
                continue
            alt = KernelCode(wgsl, wgs, code.bindings, groups, code.label + f" ({cls})")
            v = self._dispatch(alt, where)
            entry.setdefault("variants", {})[cls] = {"kernel": v["kernel"], "workgroups": v["workgroups"]}
        return entry

    def _dispatch(self, code, where) -> dict:
        """The manifest entry of one dispatch, adding its kernel when new."""
        self.max_bindings = max(self.max_bindings, len(code.bindings))
        self.max_workgroups = max(self.max_workgroups, *code.workgroups)
        bound = [where(s) for s, _ in code.bindings]
        written = {b for (b, _), (_, a) in zip(bound, code.bindings) if a == "read_write"}
        both = [j for j, ((b, _), (_, a)) in enumerate(zip(bound, code.bindings)) if a == "read" and b in written]
        if both:  # a tensor read beside one written in the same arena: WebGPU allows one buffer
            code = _writable(code, both)  # bound twice for writing, not for reading and writing
        if code.wgsl not in self.kernel_index:
            self.kernels.append({"label": code.label, "wgsl": code.wgsl, "entry": "main",
                                 "workgroup_size": list(code.workgroup_size),
                                 "access": [a for _, a in code.bindings],
                                 "sha256": hashlib.sha256(code.wgsl.encode()).hexdigest()})
            self.kernel_index[code.wgsl] = len(self.kernels) - 1
        entry = {"kernel": self.kernel_index[code.wgsl], "buffers": [b for b, _ in bound],
                 "workgroups": list(code.workgroups)}
        if any(r is not None for _, r in bound):
            entry["ranges"] = [r for _, r in bound]
        return entry

    def write(self, meta: dict) -> bytes:
        blob = self._early if self._early is not None and self._early.same(self.blob) else blobs.Blob(self.blob)
        persistent = sum(self.buffers[b] for b in {t["buffer"] for t in self.tensors if t["role"] != "output"})
        # size variants as one kernel; the quick tier's kernels lifted further first, then merged into fewer pipelines
        skeletons = lift_sizes.Skeletons()
        kernels, programs = lift_sizes.quick_tier(self.kernels, self.programs, self.options, skeletons)
        kernels, programs = merge_quick.merge(*lift_sizes.lift(kernels, programs, self.options, skeletons), self.options)
        manifest = {
            "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "compiler_version": self.version,
            "requires": {"features": [], "limits": {
                "max_storage_buffers_per_shader_stage": self.max_bindings,
                "max_compute_workgroups_per_dimension": self.max_workgroups,
                "max_storage_buffer_binding_size": max(self.buffers, default=0),
                "max_buffer_size": max(self.buffers, default=0)}},
            "buffers": self.buffers, "tensors": self.tensors, "kernels": kernels,
            "programs": programs,
            "blob_checksum": {"algorithm": "crc32", "chunk_bytes": blobs.CHUNK, "values": b""},
            "memory": {"buffer_bytes": int(sum(self.buffers)), "persistent_bytes": int(persistent),
                       "shared_scratch": bool(self.options.share_scratch)},
            **meta,
        }

        head_of = _head_of(manifest, blob.length)
        # the trailing digest covers everything up to the blob; the manifest holds the
        # blob's chunk checksums, so the weights are read once (3.4 GB for an SD U-Net)
        try:
            return blobs.package_bytes(head_of, blob, lambda head: hashlib.sha256(head).digest(), self.reservation)
        finally:
            if self.reservation is not None:
                self.reservation.release()


def _head_of(manifest: dict, blob_length: int):
    """head_of(crcs) for blobs.package_bytes: the file's bytes before the blob, its manifest
    holding the chunk checksums `crcs` (4 bytes per chunk: the length is known before the
    values). The manifest is packed once, in the pieces around the checksums (msgpack writes a
    map as its header, then each key and value), not once per call: a large model's takes a
    tenth of a second."""
    packer = msgpack.Packer(use_bin_type=True)
    pieces, slot = [packer.pack_map_header(len(manifest))], None
    for key, value in manifest.items():
        pieces.append(packer.pack(key))
        if key != "blob_checksum":
            pieces.append(packer.pack(value))
            continue
        checksum = {**value, "values": b""}
        pieces.append(packer.pack_map_header(len(checksum)))
        for k, v in checksum.items():
            pieces.append(packer.pack(k))
            if k == "values":
                slot = len(pieces)
            pieces.append(packer.pack(v))
    before, after = b"".join(pieces[:slot]), b"".join(pieces[slot + 1:])

    def head_of(crcs: bytes) -> bytes:
        values = packer.pack(crcs)
        return b"".join((MAGIC, struct.pack("<IQ", FORMAT_VERSION, len(before) + len(values) + len(after)),
                         before, values, after, struct.pack("<Q", blob_length)))
    return head_of


class _Placement:
    """Where a binding key of one program lives: (buffer, [byte offset, bytes] or None for all of it)."""

    def __init__(self, sched: Schedule, buffer_of: dict, arena_buffer: dict):
        self.g, self.placement = sched.graph, sched.placement
        self.buffer_of, self.arena_buffer = buffer_of, arena_buffer

    def where(self, s):
        if isinstance(s, tuple) and s[0] == "view":
            _, arena, lo, count = s
            return self.arena_buffer[arena], [lo * 4, bytes_of(count)]
        if isinstance(s, tuple) and s[0] != "temp":
            return self.arena_buffer[s], None
        if s in self.placement:
            arena, at = self.placement[s]
            return self.arena_buffer[arena], [at * 4, nbytes(self.g.nodes[s])]
        return self.buffer_of[s], None


def bytes_of(elements: int, item_bytes: int = 4) -> int:
    return max(ALIGN, -(-elements * item_bytes // ALIGN) * ALIGN)


def _writable(code, slots):
    """`code` with bindings `slots` declared read_write (they are only read)."""
    wgsl = code.wgsl
    for j in slots:
        decl = f"@binding({j}) var<storage, read>"
        if wgsl.count(decl) != 1:
            raise RuntimeError(f"kernel {code.label}: no single read-only declaration of binding {j}")
        wgsl = wgsl.replace(decl, f"@binding({j}) var<storage, read_write>")
    bindings = [(s, "read_write" if j in slots else a) for j, (s, a) in enumerate(code.bindings)]
    return KernelCode(wgsl, code.workgroup_size, bindings, code.workgroups, code.label, code.temps, code.variants)


def _pack_by_lifetime(first: dict, last: dict, size_of, new_buffer, buffers, pool=()) -> dict:
    """Storage -> buffer. Largest tensors first, each into the first buffer none of whose
    tensors is alive at the same time (so a buffer is as big as its first tensor), else a
    new buffer. Placing in time order and growing buffers to fit leaves more bytes unused
    (bench/REJECTED.md: other orders for packing scratch into whole buffers)."""
    placed = {}
    # per buffer: [buffer, bytes, the dispatches it is busy in as a bit mask]; `pool`: other
    # programs' buffers, free here. (Bit masks, not sorted interval lists: one AND per try
    # instead of a bisect, over the ~10,000 tensors of a large training step.)
    spans = [[b, buffers[b], 0] for b in sorted(pool, key=lambda b: -buffers[b])]
    size = {s: size_of(s) for s in first}
    order = {s: (-size[s], first[s], 0, s, ()) if isinstance(s, int) else (-size[s], first[s], 1, 0, s)
             for s in first}  # (node ids before temps and arenas on ties; those by their numbers)
    for s in sorted(first, key=order.__getitem__):
        need = size[s]
        busy = ((1 << (last[s] - first[s] + 1)) - 1) << first[s]
        for span in spans:
            if span[1] >= need and not span[2] & busy:
                span[2] |= busy
                placed[s] = span[0]
                break
        else:
            b = new_buffer(need)
            spans.append([b, need, busy])
            placed[s] = b
    return placed


def _peak(first: dict, last: dict, size_of, end: int) -> int:
    delta = [0] * (end + 2)
    for s, f in first.items():
        delta[f] += size_of(s)
        delta[last[s] + 1] -= size_of(s)
    peak = live = 0
    for d in delta:
        live += d
        peak = max(peak, live)
    return peak


def _source(g, role: str, name: str) -> dict:
    """{"source": element type} where the source model's differs from the tensor's (a Session
    converts there: runtime/inputs.py, runtime/session.py); else nothing."""
    src = g.io_dtypes.get((role, name))
    return {"source": src} if src else {}


def initializer_notes(model) -> dict:
    """{"initializers": [...]}: the weights an importer split or kept tied (Model.initializer_notes),
    for `meganeura info`; nothing when there are none (optional in the manifest)."""
    notes = getattr(model, "initializer_notes", ())
    return {"initializers": [{"action": n.action, "initializer": n.initializer, "params": list(n.params),
                              "why": n.why} for n in notes]} if notes else {}


def _stored(role: str, value) -> bool:
    """Is a leaf's value stored in the blob? (optimizer state only when not all zeros)"""
    return role in ("param", "state", "constant") and value is not None and (role != "state" or bool(np.any(value)))

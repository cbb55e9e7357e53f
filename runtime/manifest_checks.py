"""The manifest's checks: every field, index and size against the others (PackageError naming
the first problem). In two parts, so that a first launch can make and fill a gigabyte of weights'
buffers once their sizes and places are checked, while the kernels and dispatches are."""
from __future__ import annotations

import hashlib

from .format import (ACCESS, DTYPES, FORMAT_NAME, MAX_LIFTED, OFFSET_ALIGN, QUICK, READABLE_VERSIONS, ROLES, VARIANTS,
                     tensor_bytes)
from .manifest_fields import _dict, _fail, _int, _ints, _key, _list, _str


def validate_manifest(m) -> None:
    """Check every field, index and size; raise PackageError naming the first problem."""
    check_layout(m)
    check_programs(m)


def check_layout(m) -> None:
    """The format, the buffers' sizes, the tensors' places in them, the memory totals and what the
    package requires of a device: all that making and filling its buffers needs."""
    _dict(m, "manifest")
    if _key(m, "format", "manifest") != FORMAT_NAME:
        _fail(f"not a meganeura package: format is {m['format']!r:.40}")
    version = _key(m, "format_version", "manifest")
    if isinstance(version, bool) or not isinstance(version, int) or version not in READABLE_VERSIONS:
        _fail(f"manifest format_version {m['format_version']!r:.20} is not one of {READABLE_VERSIONS}")
    _str(_key(m, "compiler_version", "manifest"), "compiler_version", 64)
    ck = _dict(_key(m, "blob_checksum", "manifest"), "blob_checksum")
    if _key(ck, "algorithm", "blob_checksum") != "crc32":
        _fail(f"blob_checksum: unknown algorithm {ck['algorithm']!r:.40}")
    _int(_key(ck, "chunk_bytes", "blob_checksum"), "blob_checksum.chunk_bytes", 1 << 10, 1 << 30)
    if not isinstance(_key(ck, "values", "blob_checksum"), bytes):
        _fail("blob_checksum.values: expected bytes")
    buffers = _list(_key(m, "buffers", "manifest"), "buffers")
    for i, b in enumerate(buffers):
        _int(b, f"buffers[{i}]", 4, 1 << 40)
        if b % 4:
            _fail(f"buffers[{i}]: size {b} is not a multiple of 4")
    nbuf = len(buffers)
    tensors = _list(_key(m, "tensors", "manifest"), "tensors")
    leaf_names = set()
    for i, t in enumerate(tensors):
        w = f"tensors[{i}]"
        _dict(t, w)
        name = _str(_key(t, "name", w), f"{w}.name", 512)
        role = _key(t, "role", w)
        if role not in ROLES:
            _fail(f"{w}.role: {role!r:.40} is not one of {ROLES}")
        if not isinstance(_key(t, "dtype", w), str) or t["dtype"] not in DTYPES:
            _fail(f"{w}.dtype: {t['dtype']!r:.40} is not one of {tuple(DTYPES)}")
        if t["dtype"] == "f16" and role != "param":
            _fail(f"{w}.dtype: only parameters are stored in f16, not {role} tensors")
        shape = _list(_key(t, "shape", w), f"{w}.shape", 8)
        _ints(shape, f"{w}.shape", 0, 1 << 32)
        size = tensor_bytes(t)
        b = _int(_key(t, "buffer", w), f"{w}.buffer", 0, nbuf - 1 if nbuf else -1)
        offset = _int(t.get("offset", 0), f"{w}.offset")
        if offset % OFFSET_ALIGN:
            _fail(f"{w}.offset: {offset} is not a multiple of {OFFSET_ALIGN}")
        if role == "input" and offset:
            _fail(f"{w}: an input is a buffer of its own (offset {offset})")
        if offset + size > buffers[b]:
            _fail(f"{w} ({name}): {size} bytes at offset {offset} do not fit buffer {b} of {buffers[b]} bytes")
        if role != "output":
            if name in leaf_names:
                _fail(f"{w}: tensor name {name!r} appears twice")
            leaf_names.add(name)
            if t.get("init") not in ("zeros", "blob"):
                _fail(f"{w}.init: {t.get('init')!r:.20} is not 'zeros' or 'blob'")
            if role == "input" and t["init"] != "zeros":
                _fail(f"{w}: an input cannot carry initial data")
        else:
            _str(_key(t, "program", w), f"{w}.program", 64)
    mem = _dict(_key(m, "memory", "manifest"), "memory")
    if _int(_key(mem, "buffer_bytes", "memory"), "memory.buffer_bytes") != sum(buffers):
        _fail(f"memory.buffer_bytes {mem['buffer_bytes']} is not the sum of the buffer sizes {sum(buffers)}")
    if not isinstance(mem.get("shared_scratch", False), bool):
        _fail("memory.shared_scratch: expected true or false")
    req = _dict(_key(m, "requires", "manifest"), "requires")
    for f in _list(_key(req, "features", "requires"), "requires.features", 64):
        _str(f, "requires.features", 64)
    for k, v in _dict(_key(req, "limits", "requires"), "requires.limits").items():
        _str(k, "requires.limits", 128)
        _int(v, f"requires.limits[{k!r:.40}]")


def check_programs(m) -> None:
    """The kernels and the programs' dispatches (every index into the buffers and kernels, every
    bound range), the batch and the training fields; after check_layout."""
    version, buffers, tensors = m["format_version"], m["buffers"], m["tensors"]
    kernels = _list(_key(m, "kernels", "manifest"), "kernels", 1 << 16)
    for i, k in enumerate(kernels):
        w = f"kernels[{i}]"
        _dict(k, w)
        _str(_key(k, "wgsl", w), f"{w}.wgsl", 1 << 22)
        _str(_key(k, "entry", w), f"{w}.entry", 64)
        _str(k.get("label", ""), f"{w}.label", 256)
        ws = _list(_key(k, "workgroup_size", w), f"{w}.workgroup_size", 3)
        if len(ws) != 3:
            _fail(f"{w}.workgroup_size: needs 3 numbers")
        _ints(ws, f"{w}.workgroup_size", 1, 1024)
        access = _list(_key(k, "access", w), f"{w}.access", 64)
        for a in access:
            if a not in ACCESS:
                _fail(f"{w}.access: {a!r:.20} is not one of {ACCESS}")
        if _int(k.get("lifted", 0), f"{w}.lifted", 0, MAX_LIFTED) and version < 4:
            _fail(f"{w}.lifted: format version {version} has no lifted sizes")
        if hashlib.sha256(k["wgsl"].encode()).hexdigest() != _key(k, "sha256", w):
            _fail(f"{w}: WGSL text does not match its sha256")
    programs = _dict(_key(m, "programs", "manifest"), "programs")
    if "infer" not in programs:
        _fail("programs: no 'infer' program")
    for pname, p in programs.items():
        w = f"programs[{pname!r:.40}]"
        _str(pname, w, 64)
        _dict(p, w)
        for kind, role in (("inputs", "input"), ("outputs", "output")):
            d = _dict(_key(p, kind, w), f"{w}.{kind}")
            for k, ti in d.items():
                _str(k, f"{w}.{kind}", 512)
                _int(ti, f"{w}.{kind}[{k!r:.40}]", 0, len(tensors) - 1 if tensors else -1)
                if tensors[ti]["role"] != role or tensors[ti]["name"] != k:
                    _fail(f"{w}.{kind}[{k!r:.40}]: tensor {ti} is not the {role} {k!r:.40}")
        _int(_key(p, "scratch_peak_bytes", w), f"{w}.scratch_peak_bytes")
        if "row_mask" in p and (not isinstance(p["row_mask"], str) or p["row_mask"] not in p["inputs"]):
            _fail(f"{w}.row_mask names no input")
        for j, d in enumerate(_list(_key(p, "dispatches", w), f"{w}.dispatches", 1 << 20)):
            if not _plain_dispatch(d, kernels, buffers, version >= 5):
                _check_dispatch(d, f"{w}.dispatches[{j}]", kernels, buffers, version)
    batch = m.get("batch")
    if batch is not None:
        _int(_key(_dict(batch, "batch"), "size", "batch"), "batch.size", 1, 1 << 31)
    train = m.get("training")
    if train is not None:
        _dict(train, "training")
        for k in ("loss", "optimizer"):
            _str(_key(train, k, "training"), f"training.{k}", 64)
        if isinstance(_key(train, "lr", "training"), bool) or not isinstance(train["lr"], (int, float)):
            _fail(f"training.lr: expected a number, got {type(train['lr']).__name__}")
        for f in _list(_key(train, "frozen", "training"), "training.frozen"):
            _str(f, "training.frozen", 512)
        if "train_step" not in programs:
            _fail("training: no 'train_step' program")


def _check_dispatch(d, dw, kernels, buffers, version) -> None:
    """One dispatch's every index and range, PackageError naming the first problem (`dw`: where it is)."""
    nbuf = len(buffers)
    _dict(d, dw)
    k = _int(_key(d, "kernel", dw), f"{dw}.kernel", 0, len(kernels) - 1 if kernels else -1)
    bufs = _list(_key(d, "buffers", dw), f"{dw}.buffers", 64)
    if len(bufs) != len(kernels[k]["access"]):
        _fail(f"{dw}: {len(bufs)} buffers for a kernel with {len(kernels[k]['access'])} bindings")
    _ints(bufs, f"{dw}.buffers", 0, nbuf - 1 if nbuf else -1)
    ranges = _ranges(d, dw, bufs, buffers)
    access = kernels[k]["access"]
    # WebGPU refuses a buffer read and written in one dispatch; written twice, the ranges
    # must not overlap (only a buffer bound more than once can be either)
    if len(set(bufs)) < len(bufs):
        for bi in {bi for bi, a in zip(bufs, access) if a == "read_write"}:
            spans = sorted((r or [0, buffers[bi]], a) for b, r, a in zip(bufs, ranges, access) if b == bi)
            if any(a != "read_write" for _, a in spans) or \
                    any(lo < prev[0] + prev[1] for (prev, _), ((lo, _), _) in zip(spans, spans[1:])):
                _fail(f"{dw}: buffer {bi} is bound for reading and writing, or written twice where ranges meet")
    _workgroups(d, dw)
    _lifted(d, dw, kernels[k])
    for cls, v in _dict(d.get("variants", {}), f"{dw}.variants").items():
        vw = f"{dw}.variants[{cls!r:.20}]"
        if cls not in VARIANTS:
            _fail(f"{vw}: unknown variant; known: {VARIANTS}")
        if cls == QUICK and version < 5:
            _fail(f"{vw}: format version {version} has no quick variants")
        _dict(v, vw)
        if set(v) - _VARIANT_KEYS:  # a variant swaps the kernel, never what it binds
            _fail(f"{vw}: a variant holds only 'kernel', 'workgroups' and 'lifted', not {sorted(set(v))!r:.60}")
        kv = _int(_key(v, "kernel", vw), f"{vw}.kernel", 0, len(kernels) - 1)
        if kernels[kv]["access"] != kernels[k]["access"]:
            _fail(f"{vw}: the variant kernel binds buffers differently")
        _workgroups(v, vw)
        _lifted(v, vw, kernels[kv])


def _plain_dispatch(d, kernels, buffers, quick_ok) -> bool:
    """_check_dispatch's checks for the common dispatch, making no message: True only when every
    one passes (else _check_dispatch runs and names the problem). A manifest has thousands of
    dispatches (SD-1.5: 5,637, with 6,932 variants): its checks 41 -> 26 ms on a 2-core VM."""
    if type(d) is not dict or not d.keys() <= _DISPATCH_KEYS:
        return False
    k, bufs = d.get("kernel"), d.get("buffers")
    if type(k) is not int or not 0 <= k < len(kernels) or type(bufs) is not list:
        return False
    kernel = kernels[k]
    if len(bufs) != len(kernel["access"]):
        return False
    nbuf = len(buffers)
    for b in bufs:
        if type(b) is not int or not 0 <= b < nbuf:
            return False
    if len(set(bufs)) < len(bufs) and any(  # (a buffer bound twice and written: the full rules)
            bufs.count(b) > 1 for b, a in zip(bufs, kernel["access"]) if a == "read_write"):
        return False
    if "ranges" in d:
        ranges = d["ranges"]
        if type(ranges) is not list or len(ranges) != len(bufs):
            return False
        for r, b in zip(ranges, bufs):
            if r is None:
                continue
            if type(r) is not list or len(r) != 2:
                return False
            lo, size = r
            if type(lo) is not int or type(size) is not int or lo < 0 or lo % OFFSET_ALIGN or size <= 0 or size % 4 \
                    or lo + size > buffers[b]:
                return False
    if not _plain_run(d, kernel):
        return False
    variants = d.get("variants", {})
    if type(variants) is not dict:
        return False
    for cls, v in variants.items():
        if cls not in VARIANTS or (cls == QUICK and not quick_ok) or type(v) is not dict or not v.keys() <= _VARIANT_KEYS:
            return False
        kv = v.get("kernel")
        if type(kv) is not int or not 0 <= kv < len(kernels) or kernels[kv]["access"] != kernel["access"] \
                or not _plain_run(v, kernels[kv]):
            return False
    return True


_DISPATCH_KEYS = frozenset({"kernel", "buffers", "ranges", "workgroups", "lifted", "variants"})
_VARIANT_KEYS = frozenset({"kernel", "workgroups", "lifted"})


def _plain_run(d, kernel) -> bool:
    """_workgroups' and _lifted's checks of a dispatch (or variant) for `kernel`, making no message."""
    wg = d.get("workgroups")
    if type(wg) is not list or len(wg) != 3:
        return False
    for n in wg:
        if type(n) is not int or not 0 <= n <= 1 << 31:
            return False
    want = kernel.get("lifted", 0)
    if not want:
        return "lifted" not in d
    values = d.get("lifted")
    if type(values) is not list or len(values) != want:
        return False
    for n in values:
        if type(n) is not int or not 0 <= n <= (1 << 32) - 1:
            return False
    return True


def _ranges(d, where, bufs, buffers) -> list:
    """A dispatch's bound ranges: [byte offset, bytes] per binding, None for a whole buffer."""
    if "ranges" not in d:
        return [None] * len(bufs)
    ranges = _list(d["ranges"], f"{where}.ranges", len(bufs))
    if len(ranges) != len(bufs):
        _fail(f"{where}.ranges: {len(ranges)} ranges for {len(bufs)} buffers")
    for r, bi in zip(ranges, bufs):
        if r is None:
            continue
        r = _list(r, f"{where}.ranges", 2)
        lo, size = (_int(v, f"{where}.ranges") for v in r) if len(r) == 2 else (-1, 0)
        if lo % OFFSET_ALIGN or size <= 0 or size % 4 or lo + size > buffers[bi]:
            _fail(f"{where}.ranges: {r!r:.40} is not a range of buffer {bi} ({buffers[bi]} bytes) at a "
                  f"multiple of {OFFSET_ALIGN} bytes")
    return ranges


def _lifted(d, where, kernel):
    """A dispatch's lifted sizes: as many u32 values as its kernel reads (compiler/lift_sizes.py)."""
    want = kernel.get("lifted", 0)
    if not want:
        if "lifted" in d:
            _fail(f"{where}.lifted: its kernel reads no lifted sizes")
        return
    values = _list(_key(d, "lifted", where), f"{where}.lifted", MAX_LIFTED)
    if len(values) != want:
        _fail(f"{where}.lifted: {len(values)} values for a kernel that reads {want}")
    _ints(values, f"{where}.lifted", 0, (1 << 32) - 1)


def _workgroups(d, where):
    wg = _list(_key(d, "workgroups", where), f"{where}.workgroups", 3)
    if len(wg) != 3:
        _fail(f"{where}.workgroups: needs 3 numbers")
    _ints(wg, f"{where}.workgroups", 0, 1 << 31)

"""The manifest's checks: every field, index and size against the others (PackageError naming
the first problem). In two parts, so that a first launch can make and fill a gigabyte of weights'
buffers once their sizes and places are checked, while the kernels and dispatches are."""
from __future__ import annotations

import hashlib

from .format import (ACCESS, DTYPES, FORMAT_NAME, MAX_LIFTED, OFFSET_ALIGN, QUICK, READABLE_VERSIONS, ROLES, VARIANTS,
                     tensor_bytes)
from .manifest_fields import check_dict, check_int, check_ints, check_list, check_str, fail, field
from .records import MEMORY_FIELDS, SOURCE_DTYPES


def validate_manifest(m) -> None:
    """Check every field, index and size; raise PackageError naming the first problem."""
    check_layout(m)
    check_programs(m)


def check_layout(m) -> None:
    """The format, the buffers' sizes, the tensors' places in them, the memory totals and what the
    package requires of a device: all that making and filling its buffers needs."""
    check_dict(m, "manifest")
    if field(m, "format", "manifest") != FORMAT_NAME:
        fail(f"not a meganeura package: format is {m['format']!r:.40}")
    version = field(m, "format_version", "manifest")
    if isinstance(version, bool) or not isinstance(version, int) or version not in READABLE_VERSIONS:
        fail(f"manifest format_version {m['format_version']!r:.20} is not one of {READABLE_VERSIONS}")
    check_str(field(m, "compiler_version", "manifest"), "compiler_version", 64)
    ck = check_dict(field(m, "blob_checksum", "manifest"), "blob_checksum")
    if field(ck, "algorithm", "blob_checksum") != "crc32":
        fail(f"blob_checksum: unknown algorithm {ck['algorithm']!r:.40}")
    check_int(field(ck, "chunk_bytes", "blob_checksum"), "blob_checksum.chunk_bytes", 1 << 10, 1 << 30)
    if not isinstance(field(ck, "values", "blob_checksum"), bytes):
        fail("blob_checksum.values: expected bytes")
    buffers = check_list(field(m, "buffers", "manifest"), "buffers")
    for i, b in enumerate(buffers):
        check_int(b, f"buffers[{i}]", 4, 1 << 40)
        if b % 4:
            fail(f"buffers[{i}]: size {b} is not a multiple of 4")
    nbuf = len(buffers)
    tensors = check_list(field(m, "tensors", "manifest"), "tensors")
    leaf_names = set()
    for i, t in enumerate(tensors):
        w = f"tensors[{i}]"
        check_dict(t, w)
        name = check_str(field(t, "name", w), f"{w}.name", 512)
        role = field(t, "role", w)
        if role not in ROLES:
            fail(f"{w}.role: {role!r:.40} is not one of {ROLES}")
        if not isinstance(field(t, "dtype", w), str) or t["dtype"] not in DTYPES:
            fail(f"{w}.dtype: {t['dtype']!r:.40} is not one of {tuple(DTYPES)}")
        if t["dtype"] == "f16" and role != "param":
            fail(f"{w}.dtype: only parameters are stored in f16, not {role} tensors")
        if "source" in t and (role not in ("input", "output") or t["source"] not in SOURCE_DTYPES.get(t["dtype"], ())):
            fail(f"{w}.source: {t['source']!r:.40} is no source type of an {t['dtype']} {role}")
        shape = check_list(field(t, "shape", w), f"{w}.shape", 8)
        check_ints(shape, f"{w}.shape", 0, 1 << 32)
        size = tensor_bytes(t)
        b = check_int(field(t, "buffer", w), f"{w}.buffer", 0, nbuf - 1 if nbuf else -1)
        offset = check_int(t.get("offset", 0), f"{w}.offset")
        if offset % OFFSET_ALIGN:
            fail(f"{w}.offset: {offset} is not a multiple of {OFFSET_ALIGN}")
        if role == "input" and offset:
            fail(f"{w}: an input is a buffer of its own (offset {offset})")
        if offset + size > buffers[b]:
            fail(f"{w} ({name}): {size} bytes at offset {offset} do not fit buffer {b} of {buffers[b]} bytes")
        if role != "output":
            if name in leaf_names:
                fail(f"{w}: tensor name {name!r} appears twice")
            leaf_names.add(name)
            if t.get("init") not in ("zeros", "blob"):
                fail(f"{w}.init: {t.get('init')!r:.20} is not 'zeros' or 'blob'")
            if role == "input" and t["init"] != "zeros":
                fail(f"{w}: an input cannot carry initial data")
        else:
            check_str(field(t, "program", w), f"{w}.program", 64)
    mem = check_dict(field(m, "memory", "manifest"), "memory")
    if check_int(field(mem, "buffer_bytes", "memory"), "memory.buffer_bytes") != sum(buffers):
        fail(f"memory.buffer_bytes {mem['buffer_bytes']} is not the sum of the buffer sizes {sum(buffers)}")
    if not isinstance(mem.get("shared_scratch", False), bool):
        fail("memory.shared_scratch: expected true or false")
    req = check_dict(field(m, "requires", "manifest"), "requires")
    for f in check_list(field(req, "features", "requires"), "requires.features", 64):
        check_str(f, "requires.features", 64)
    for k, v in check_dict(field(req, "limits", "requires"), "requires.limits").items():
        check_str(k, "requires.limits", 128)
        check_int(v, f"requires.limits[{k!r:.40}]")


def check_programs(m) -> None:
    """The kernels and the programs' dispatches (every index into the buffers and kernels, every
    bound range), the batch and the training fields; after check_layout."""
    version, buffers, tensors = m["format_version"], m["buffers"], m["tensors"]
    kernels = check_list(field(m, "kernels", "manifest"), "kernels", 1 << 16)
    for i, k in enumerate(kernels):
        w = f"kernels[{i}]"
        check_dict(k, w)
        check_str(field(k, "wgsl", w), f"{w}.wgsl", 1 << 22)
        check_str(field(k, "entry", w), f"{w}.entry", 64)
        check_str(k.get("label", ""), f"{w}.label", 256)
        ws = check_list(field(k, "workgroup_size", w), f"{w}.workgroup_size", 3)
        if len(ws) != 3:
            fail(f"{w}.workgroup_size: needs 3 numbers")
        check_ints(ws, f"{w}.workgroup_size", 1, 1024)
        access = check_list(field(k, "access", w), f"{w}.access", 64)
        for a in access:
            if a not in ACCESS:
                fail(f"{w}.access: {a!r:.20} is not one of {ACCESS}")
        if check_int(k.get("lifted", 0), f"{w}.lifted", 0, MAX_LIFTED) and version < 4:
            fail(f"{w}.lifted: format version {version} has no lifted sizes")
        if hashlib.sha256(k["wgsl"].encode()).hexdigest() != field(k, "sha256", w):
            fail(f"{w}: WGSL text does not match its sha256")
    programs = check_dict(field(m, "programs", "manifest"), "programs")
    if "infer" not in programs:
        fail("programs: no 'infer' program")
    for pname, p in programs.items():
        w = f"programs[{pname!r:.40}]"
        check_str(pname, w, 64)
        check_dict(p, w)
        for kind, role in (("inputs", "input"), ("outputs", "output")):
            d = check_dict(field(p, kind, w), f"{w}.{kind}")
            for k, ti in d.items():
                check_str(k, f"{w}.{kind}", 512)
                check_int(ti, f"{w}.{kind}[{k!r:.40}]", 0, len(tensors) - 1 if tensors else -1)
                if tensors[ti]["role"] != role or tensors[ti]["name"] != k:
                    fail(f"{w}.{kind}[{k!r:.40}]: tensor {ti} is not the {role} {k!r:.40}")
        check_int(field(p, "scratch_peak_bytes", w), f"{w}.scratch_peak_bytes")
        if "row_mask" in p and (not isinstance(p["row_mask"], str) or p["row_mask"] not in p["inputs"]):
            fail(f"{w}.row_mask names no input")
        for j, d in enumerate(check_list(field(p, "dispatches", w), f"{w}.dispatches", 1 << 20)):
            if not _plain_dispatch(d, kernels, buffers, version >= 5):
                _check_dispatch(d, f"{w}.dispatches[{j}]", kernels, buffers, version)
    batch = m.get("batch")
    if batch is not None:
        check_int(field(check_dict(batch, "batch"), "size", "batch"), "batch.size", 1, 1 << 31)
    train = m.get("training")
    if train is not None:
        check_dict(train, "training")
        for k in ("loss", "optimizer"):
            check_str(field(train, k, "training"), f"training.{k}", 64)
        if isinstance(field(train, "lr", "training"), bool) or not isinstance(train["lr"], (int, float)):
            fail(f"training.lr: expected a number, got {type(train['lr']).__name__}")
        for f in check_list(field(train, "frozen", "training"), "training.frozen"):
            check_str(f, "training.frozen", 512)
        if train.get("ignore_index") is not None:
            check_int(train["ignore_index"], "training.ignore_index", -(1 << 24) + 1, 1 << 24)
        if train.get("classes") is not None:
            check_int(train["classes"], "training.classes", 1, 1 << 24)
        if "train_step" not in programs:
            fail("training: no 'train_step' program")
        if train.get("lora") is not None:
            _check_lora(train["lora"], {t["name"] for t in tensors if t["role"] == "param"})
        if train.get("memory") is not None:  # a memory budget's record (compilers since it was added)
            memory = check_dict(train["memory"], "training.memory")
            for k in MEMORY_FIELDS:
                check_int(field(memory, k, "training.memory"), f"training.memory.{k}", 0, 1 << 62)
    _check_initializers(m.get("initializers"))


def _check_initializers(notes) -> None:
    """The optional record of weights the compiler split or kept tied (`meganeura info` prints it)."""
    for i, n in enumerate(check_list(notes, "initializers", 1 << 20) if notes is not None else ()):
        w = f"initializers[{i}]"
        check_dict(n, w)
        if field(n, "action", w) not in ("split", "tied"):
            fail(f"{w}.action: {n['action']!r:.40} is not 'split' or 'tied'")
        check_str(field(n, "initializer", w), f"{w}.initializer", 512)
        check_str(field(n, "why", w), f"{w}.why", 512)
        for p in check_list(field(n, "params", w), f"{w}.params", 1 << 16):
            check_str(p, f"{w}.params", 512)


def _check_lora(lora, params: set) -> None:
    """training.lora: a rank, an alpha, and adapters naming parameters of the package."""
    check_dict(lora, "training.lora")
    check_int(field(lora, "rank", "training.lora"), "training.lora.rank", 1, 1 << 20)
    alpha = field(lora, "alpha", "training.lora")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < float("inf"):
        fail(f"training.lora.alpha: expected a positive number, got {alpha!r:.40}")
    for j, a in enumerate(check_list(field(lora, "adapters", "training.lora"), "training.lora.adapters")):
        w = f"training.lora.adapters[{j}]"
        check_dict(a, w)
        check_str(field(a, "module", w), f"{w}.module", 512)
        for k in ("weight", "a", "b"):
            if check_str(field(a, k, w), f"{w}.{k}", 512) not in params:
                fail(f"{w}.{k}: {a[k]!r:.80} names no parameter")
        if not isinstance(field(a, "transposed", w), bool):
            fail(f"{w}.transposed: expected true or false")


def _check_dispatch(d, dw, kernels, buffers, version) -> None:
    """One dispatch's every index and range, PackageError naming the first problem (`dw`: where it is)."""
    nbuf = len(buffers)
    check_dict(d, dw)
    k = check_int(field(d, "kernel", dw), f"{dw}.kernel", 0, len(kernels) - 1 if kernels else -1)
    bufs = check_list(field(d, "buffers", dw), f"{dw}.buffers", 64)
    if len(bufs) != len(kernels[k]["access"]):
        fail(f"{dw}: {len(bufs)} buffers for a kernel with {len(kernels[k]['access'])} bindings")
    check_ints(bufs, f"{dw}.buffers", 0, nbuf - 1 if nbuf else -1)
    ranges = _ranges(d, dw, bufs, buffers)
    access = kernels[k]["access"]
    # WebGPU refuses a buffer read and written in one dispatch; written twice, the ranges
    # must not overlap (only a buffer bound more than once can be either)
    if len(set(bufs)) < len(bufs):
        for bi in {bi for bi, a in zip(bufs, access) if a == "read_write"}:
            spans = sorted((r or [0, buffers[bi]], a) for b, r, a in zip(bufs, ranges, access) if b == bi)
            if any(a != "read_write" for _, a in spans) or \
                    any(lo < prev[0] + prev[1] for (prev, _), ((lo, _), _) in zip(spans, spans[1:])):
                fail(f"{dw}: buffer {bi} is bound for reading and writing, or written twice where ranges meet")
    _workgroups(d, dw)
    _lifted(d, dw, kernels[k])
    for cls, v in check_dict(d.get("variants", {}), f"{dw}.variants").items():
        vw = f"{dw}.variants[{cls!r:.20}]"
        if cls not in VARIANTS:
            fail(f"{vw}: unknown variant; known: {VARIANTS}")
        if cls == QUICK and version < 5:
            fail(f"{vw}: format version {version} has no quick variants")
        check_dict(v, vw)
        if set(v) - _VARIANT_KEYS:  # a variant swaps the kernel, never what it binds
            fail(f"{vw}: a variant holds only 'kernel', 'workgroups' and 'lifted', not {sorted(set(v))!r:.60}")
        kv = check_int(field(v, "kernel", vw), f"{vw}.kernel", 0, len(kernels) - 1)
        if kernels[kv]["access"] != kernels[k]["access"]:
            fail(f"{vw}: the variant kernel binds buffers differently")
        _workgroups(v, vw)
        _lifted(v, vw, kernels[kv])


def _plain_dispatch(d, kernels, buffers, quick_ok) -> bool:
    """_check_dispatch's checks for the common dispatch, making no message: True only when every
    one passes (else _check_dispatch runs and names the problem): a big model's manifest has
    thousands of dispatches, each with variants, and most are plain."""
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
    ranges = check_list(d["ranges"], f"{where}.ranges", len(bufs))
    if len(ranges) != len(bufs):
        fail(f"{where}.ranges: {len(ranges)} ranges for {len(bufs)} buffers")
    for r, bi in zip(ranges, bufs):
        if r is None:
            continue
        r = check_list(r, f"{where}.ranges", 2)
        lo, size = (check_int(v, f"{where}.ranges") for v in r) if len(r) == 2 else (-1, 0)
        if lo % OFFSET_ALIGN or size <= 0 or size % 4 or lo + size > buffers[bi]:
            fail(f"{where}.ranges: {r!r:.40} is not a range of buffer {bi} ({buffers[bi]} bytes) at a "
                  f"multiple of {OFFSET_ALIGN} bytes")
    return ranges


def _lifted(d, where, kernel):
    """A dispatch's lifted sizes: as many u32 values as its kernel reads (compiler/codegen/lift_sizes.py)."""
    want = kernel.get("lifted", 0)
    if not want:
        if "lifted" in d:
            fail(f"{where}.lifted: its kernel reads no lifted sizes")
        return
    values = check_list(field(d, "lifted", where), f"{where}.lifted", MAX_LIFTED)
    if len(values) != want:
        fail(f"{where}.lifted: {len(values)} values for a kernel that reads {want}")
    check_ints(values, f"{where}.lifted", 0, (1 << 32) - 1)


def _workgroups(d, where):
    wg = check_list(field(d, "workgroups", where), f"{where}.workgroups", 3)
    if len(wg) != 3:
        fail(f"{where}.workgroups: needs 3 numbers")
    check_ints(wg, f"{where}.workgroups", 0, 1 << 31)

"""The package's weights blob (safetensors): its checksum chunks, its header parsed and checked
against the manifest, and read-only views of its arrays."""
from __future__ import annotations

import json
import math
import struct
import zlib

import numpy as np

from .errors import PackageError
from .format import DTYPES, MAX_MANIFEST
from .manifest_fields import check_dict, check_int, check_list, fail, field, no_collection
from .records import BlobChecksum, BufferPlan
from .threads import run_on_threads


def header_end(blob: memoryview, chunk: int) -> int:
    """Where the checksum chunks holding the blob's safetensors header end (its length read from
    the first 8 bytes, which must be in; a damaged length is caught by the chunks' check)."""
    n = struct.unpack_from("<Q", blob, 0)[0] if len(blob) >= 8 else 0
    return min(len(blob), -(-(8 + min(n, len(blob))) // chunk) * chunk)


def check_blob(blob: memoryview, ck: BlobChecksum, first: int, last: int, cancel=None):
    """The weights' chunks within bytes first to last (chunk bounds, or the end) against their
    CRC-32s, on threads (zlib releases the GIL); `cancel`, once set, stops it."""
    size = ck.chunk_bytes
    ranges = [(o, min(len(blob), o + size)) for o in range(0, len(blob), size)] or [(0, 0)]
    if len(ck.values) != 4 * len(ranges):
        fail(f"damaged package: {len(ck.values) // 4} weight checksums for {len(ranges)} chunks")
    want = struct.unpack(f">{len(ranges)}I", ck.values)
    bad = []

    def check(c):
        if cancel is not None and cancel.is_set():
            fail("the check was cancelled")
        a, b = ranges[c]
        if zlib.crc32(blob[a:b]) != want[c]:
            bad.append(c)
    todo = [c for c, (a, b) in enumerate(ranges) if first <= a and b <= last and (a < b or not len(blob))]
    run_on_threads([lambda c=c: check(c) for c in todo])
    if bad:
        a, b = ranges[min(bad)]
        fail(f"damaged weights: bytes {a}-{b} of the weights blob fail their checksum "
             f"({len(bad)} damaged of the {len(todo)} chunks checked)")


def weights_layout(head: memoryview, blob_len: int, plan: BufferPlan) -> dict:
    """name -> (dtype, shape, byte offset in the blob) of each weight, from the blob's first
    bytes (`head`, holding its safetensors header; parsed here, not by the safetensors library,
    whose load copies every tensor), checked against the blob's length and the plan's tensors."""
    layout = {}
    if not blob_len:
        return layout
    if blob_len < 8:
        fail("damaged weights: the safetensors header is cut short")
    (n,) = struct.unpack_from("<Q", head, 0)
    if n > blob_len - 8 or n > MAX_MANIFEST or 8 + n > len(head):
        fail(f"damaged weights: safetensors header length {n} exceeds the blob")
    try:
        with no_collection():  # a hostile header nests deep: no destructors run at that depth
            header = json.loads(bytes(head[8:8 + n]))
    except (ValueError, RecursionError) as exc:
        raise PackageError(f"damaged weights: unreadable safetensors header ({exc})") from None
    if not isinstance(header, dict):
        fail("damaged weights: the safetensors header is not a map")
    for name, e in header.items():
        if name != "__metadata__":
            layout[name] = _entry(name, e, blob_len - 8 - n, 8 + n)
    _match(layout, plan)
    return layout


def _entry(name: str, e, data_len: int, start: int) -> list:
    """[dtype, shape, byte offset in the blob] of one header entry, checked (`data_len`: the bytes
    after the header, which begin at `start`)."""
    w = f"weights[{name!r:.80}]"
    check_dict(e, w)
    name_of = field(e, "dtype", w)
    dtype = {k.upper(): v for k, v in DTYPES.items()}.get(name_of) if isinstance(name_of, str) else None
    if dtype is None:
        fail(f"{w}: dtype {name_of!r:.20} is not F32, I32 or F16")
    shape = [check_int(d, f"{w}.shape", 0, 1 << 32) for d in check_list(field(e, "shape", w), f"{w}.shape", 8)]
    offsets = check_list(field(e, "data_offsets", w), f"{w}.data_offsets", 2)
    a, b = (check_int(o, f"{w}.data_offsets", 0, data_len) for o in offsets) if len(offsets) == 2 else (-1, -1)
    count = math.prod(shape)  # Python ints: no wrap-around
    item = np.dtype(dtype).itemsize
    if a < 0 or b - a != item * count:
        fail(f"{w}: data_offsets {offsets!r:.60} do not hold {count} values of {item} bytes")
    return [np.dtype(dtype), shape, start + a]


def _match(layout: dict, plan: BufferPlan) -> None:
    """The blob holds exactly the tensors the plan stores, each with its shape and dtype."""
    named = {t.name for t in plan.tensors if t.role != "output" and t.init == "blob"}
    if set(layout) - named:
        fail(f"the weights hold tensors the manifest does not name: {sorted(set(layout) - named)[:5]}")
    for i, t in enumerate(plan.tensors):
        if t.role == "output" or t.init != "blob":
            continue
        if t.name not in layout:
            fail(f"tensors[{i}] ({t.name}): no weights in the package")
        dtype, shape, offset = layout[t.name]
        if t.shape == () and shape == [1]:
            layout[t.name][1] = shape = []  # safetensors stores scalars as [1]
        if shape != list(t.shape) or dtype != t.np_dtype:
            fail(f"tensors[{i}] ({t.name}): weights are {dtype}{shape}, the manifest says {t.dtype}{list(t.shape)}")


def weight_views(blob: memoryview, layout: dict) -> dict:
    """name -> read-only ndarray viewing the package's bytes."""
    weights = {}
    for name, (dtype, shape, offset) in layout.items():
        arr = np.frombuffer(blob, dtype, math.prod(shape), offset).reshape(shape)
        arr.flags.writeable = False  # a view of the package's bytes (which may be writable memory)
        weights[name] = arr
    return weights

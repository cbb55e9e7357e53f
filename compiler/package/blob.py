"""The weights blob (safetensors) and the package bytes around it, made on threads.

A large model's blob is gigabytes, and producing it can be half of compiling: a checksum
over every byte, and fresh memory for the package (the first touch of a page, not the copy,
is what costs). So:
- the checksum is a CRC-32 per 16 MiB chunk (`CHUNK`), computed on threads while the
  compiler still schedules (`Blob.start_checksums`), and at load verified in parallel. It
  guards against damage (truncation, flipped bits), not forgery: anyone who can edit a
  package can recompute any checksum stored in it. (CRC-32 is faster than sha256 and splits
  over cores: bench/REJECTED.md, whole-blob sha256 streamed on a thread.)
- the package's bytes object is reserved and its pages touched on a thread from the start
  of a compile (`Reservation`), at an estimated size; at the end it is resized in place
  to the exact length and filled by plain copies.
"""
from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
import threading
import zlib

import numpy as np

from ...runtime.threads import run_on_threads

CHUNK = 16 << 20  # bytes per checksum chunk (a fixed part of the format: docs/PACKAGE.md)
COPY = 64 << 20  # bytes per copy task
POPULATE_THREADS = None  # threads faulting in a Reservation's pages (None: all cores but one, at most 7)
POPULATE_STEP = 8 << 20  # bytes per madvise call (the compiler's own mmaps wait for each call)

# A bytes object is immutable once shared; filling a fresh one before anyone else sees
# it is how C code builds one (PyBytes_FromStringAndSize with NULL; _PyBytes_Resize, the
# documented way to resize one still being built). Raw pointers, not py_object: the
# object may move when resized, and ctypes would keep a reference to the old address.
_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.c_void_p
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_resize_bytes = getattr(ctypes.pythonapi, "_PyBytes_Resize", None)
if _resize_bytes is not None:
    _resize_bytes.restype = ctypes.c_int
    _resize_bytes.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_ssize_t)
_bytes_address = ctypes.pythonapi.PyBytes_AsString
_bytes_address.restype = ctypes.c_void_p
_bytes_address.argtypes = (ctypes.c_void_p,)
_decref = ctypes.pythonapi.Py_DecRef
_decref.argtypes = (ctypes.c_void_p,)
# ctypes.memmove / memset are CFUNCTYPEs: calls release the GIL while they copy
_memmove = ctypes.memmove


def cpus() -> int:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(n, 8))  # more copies in flight than that only queue for memory


def chunk_ranges(length: int) -> list:
    """[start, end) of each CHUNK of `length` bytes (one empty chunk for none)."""
    return [(o, min(length, o + CHUNK)) for o in range(0, length, CHUNK)] or [(0, 0)]


_handoff = {"users": 0, "saved": None, "lock": threading.Lock()}


def _quick_handoff(on: bool, host_switch_interval: float | None):
    """While checksums run, ask threads holding the GIL to pass it on after
    `host_switch_interval` seconds (None: the host's interval stays as it is).

    Each zlib call releases the GIL and needs it back to return; with the compiler busy in
    Python on the main thread, every return waits out the switch interval (5 ms by default).
    The interval is process-wide, so only a caller that owns the process (the command line)
    asks for it: the first user lowers it, the last one restores it."""
    if host_switch_interval is None:
        return
    with _handoff["lock"]:
        _handoff["users"] += 1 if on else -1
        if on and _handoff["users"] == 1:
            _handoff["saved"] = sys.getswitchinterval()
            sys.setswitchinterval(min(_handoff["saved"], host_switch_interval))
        elif not on and _handoff["users"] == 0:
            sys.setswitchinterval(_handoff["saved"])  # (the host_switch_interval ends)


class Blob:
    """The safetensors encoding of name -> array (by item size, then name) and its chunk checksums."""

    def __init__(self, tensors: dict):
        header, offset, self.arrays = {}, 0, []
        # 4-byte values first, f16 after them: every array then starts aligned to its values
        # (safetensors allows no padding between arrays) and the runtime's views stay aligned
        for name in sorted(tensors, key=lambda n: (-tensors[n].dtype.itemsize, n)):
            arr = tensors[name]
            assert arr.flags.c_contiguous, name
            dt = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32", np.dtype(np.float16): "F16"}[arr.dtype]
            header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
            offset += arr.nbytes
            self.arrays.append((name, arr))
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        self.head = struct.pack("<Q", len(text)) + text
        self.length = len(self.head) + offset
        self._crcs = None
        self._thread = None

    def same(self, tensors: dict) -> bool:
        """Does this blob hold exactly these arrays (the same objects)?"""
        return len(tensors) == len(self.arrays) and all(tensors.get(n) is a for n, a in self.arrays)

    def _views(self):
        """(start in the blob, bytes view) of the head and of every array, in order."""
        yield 0, memoryview(self.head)
        at = len(self.head)
        for _, arr in self.arrays:
            yield at, memoryview(arr.reshape(-1)).cast("B")  # no copy
            at += arr.nbytes

    def _chunk_tasks(self):
        """One task per CHUNK of the blob, each a CRC-32 over the pieces of the arrays in it."""
        ranges = chunk_ranges(self.length)
        pieces = [[] for _ in ranges]
        for start, view in self._views():
            end, pos = start + len(view), start
            while pos < end:
                c = pos // CHUNK
                stop = min(end, (c + 1) * CHUNK)
                pieces[c].append(view[pos - start:stop - start])
                pos = stop
        crcs = self._crcs = [0] * len(ranges)

        def crc(c):
            v = 0
            for p in pieces[c]:
                v = zlib.crc32(p, v)
            crcs[c] = v
        return [lambda c=c: crc(c) for c in range(len(ranges))]

    def start_checksums(self, host_switch_interval: float | None = None):
        """Checksum the chunks on all cores but the caller's, in the background
        (`host_switch_interval`: see _quick_handoff)."""
        if self._thread is not None:
            return
        tasks = self._chunk_tasks()
        _quick_handoff(True, host_switch_interval)

        def run():
            try:
                run_on_threads(tasks, max(1, cpus() - 1))
            finally:
                _quick_handoff(False, host_switch_interval)
        self._thread = threading.Thread(target=run, name="blob checksums", daemon=True)
        self._thread.start()

    def checksums(self) -> bytes:
        """The chunks' CRC-32s, 4 bytes each, big-endian (a fixed length for the manifest)."""
        self.start_checksums()
        self._thread.join()
        return b"".join(struct.pack(">I", c) for c in self._crcs)

    def copies(self, addr: int):
        """(destination, source, bytes) tasks that put the blob at address `addr`."""
        yield addr, self.head, len(self.head)
        at = addr + len(self.head)
        for _, arr in self.arrays:
            src, n = arr.ctypes.data, arr.nbytes
            for o in range(0, n, COPY):
                yield at + o, src + o, min(COPY, n - o)
            at += n


_PAGE = 4096
_MADV_POPULATE_WRITE = 23  # Linux 5.14+: the kernel faults the pages in, faster than touching them
try:
    _madvise = ctypes.CDLL(None, use_errno=True).madvise
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    _madvise.restype = ctypes.c_int
except (OSError, AttributeError):  # not Linux / no libc symbol: touch the pages instead
    _madvise = None


def _touch(addr: int, n: int):
    """Fault in the pages of [addr, addr + n) (the GIL released)."""
    lo, hi = -(-addr // _PAGE) * _PAGE, (addr + n) // _PAGE * _PAGE
    if _madvise is None or hi <= lo or _madvise(lo, hi - lo, _MADV_POPULATE_WRITE) != 0:
        ctypes.memset(addr, 0, n)


class Reservation:
    """A bytes object reserved early, its pages touched on a thread while the compiler
    works, and resized in place to the package's exact length at the end (a shrink gives
    pages back; a growth may move the mapping, never copying it)."""

    def __init__(self, size: int):
        self.ptr = ctypes.c_void_p(None)
        self._thread = None
        if _resize_bytes is None or size < (64 << 20):
            return  # small packages: nothing to gain
        ptr = _new_bytes(None, size)
        if not ptr:
            raise MemoryError(f"cannot reserve {size} bytes for the package")
        self.ptr = ctypes.c_void_p(ptr)
        addr = _bytes_address(self.ptr)
        step = POPULATE_STEP  # short calls: each holds the process's memory-map lock
        parts = [(addr + o, min(step, size - o)) for o in range(0, size, step)]
        self._thread = threading.Thread(target=run_on_threads, args=(
            [lambda a=a, n=n: _touch(a, n) for a, n in parts], POPULATE_THREADS or max(1, cpus() - 1)),
            name="package pages", daemon=True)
        self._thread.start()

    def take(self, size: int) -> int:
        """A bytes object of exactly `size` bytes, unshared, as a raw owned pointer."""
        if self._thread is not None:
            self._thread.join()
        if self.ptr.value and _resize_bytes(ctypes.byref(self.ptr), size) == 0:
            ptr, self.ptr = self.ptr.value, ctypes.c_void_p(None)
            return ptr
        self.ptr = ctypes.c_void_p(None)  # _PyBytes_Resize freed it on failure
        ptr = _new_bytes(None, size)
        if not ptr:
            raise MemoryError(f"cannot allocate {size} bytes for the package")
        return ptr

    def release(self):
        if self._thread is not None:
            self._thread.join()
        if self.ptr.value:
            _decref(self.ptr)
            self.ptr = ctypes.c_void_p(None)


def package_bytes(head_of, blob: Blob, tail_of, reservation: Reservation | None = None) -> bytes:
    """head | blob | tail as one new bytes object. `head_of(checksums)` is the bytes
    before the blob given the blob's chunk checksums; its length must not depend on them:
    the copies start before they are done. `tail_of(head)`: the bytes after the blob."""
    blob.start_checksums()
    head_len = len(head_of(b"\0" * 4 * len(chunk_ranges(blob.length))))
    tail_len = len(tail_of(b""))
    total = head_len + blob.length + tail_len
    ptr = (reservation or Reservation(0)).take(total)
    try:
        addr = _bytes_address(ctypes.c_void_p(ptr))
        copied = []
        tasks = [lambda t=t: (_memmove(*t), copied.append(t[2])) for t in blob.copies(addr + head_len)]
        run_on_threads(tasks, cpus())
        head = head_of(blob.checksums())
        tail = tail_of(head)
        if len(head) != head_len or len(tail) != tail_len or sum(copied) != blob.length:
            raise AssertionError("package bytes: the head changed length, or a copy failed")
        _memmove(addr, head, head_len)
        _memmove(addr + head_len + blob.length, tail, tail_len)
        out = ctypes.cast(ptr, ctypes.py_object).value  # a new reference ...
    finally:
        _decref(ptr)  # ... and ours goes (freeing the object if something above failed)
    return out

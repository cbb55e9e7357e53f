"""The weights blob (safetensors) and the package bytes around it, made on threads.

At SD-1.5 size the blob is 3.2 GB. Hashing it (sha256 runs ~1.7 GB/s on one core) and
copying it into fresh memory (page faults, not the copy, cost ~2 s on the 2-core
development VM) were the whole of writing a package, one after the other. Both release
the GIL, so here they run on threads: the hash can start while the compiler still
schedules (`Blob.start_hash`), and the copies fill one preallocated bytes object from
several threads, each array copied once.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import struct
import sys
import threading

import numpy as np

CHUNK = 64 << 20  # bytes per copy task: small enough to share, large enough to cost little GIL traffic

# A bytes object is immutable once shared; filling a fresh one before anyone else sees
# it is how C code builds one (PyBytes_FromStringAndSize with NULL). bytes.join would
# allocate the same object but fill it on one thread, holding the GIL for memoryviews.
_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_bytes_address = ctypes.pythonapi.PyBytes_AsString
_bytes_address.restype = ctypes.c_void_p
_bytes_address.argtypes = (ctypes.py_object,)
# ctypes.memmove itself is a CFUNCTYPE: calls release the GIL while they copy
_memmove = ctypes.memmove


_handoff = {"users": 0, "saved": None, "lock": threading.Lock()}


def _quick_handoff(on: bool):
    """While a hash runs, ask threads holding the GIL to pass it on after 0.2 ms, not 5.

    Each update() releases the GIL and needs it back to return; with the compiler busy in
    Python on the main thread, every return waited out the 5 ms switch interval: the SD
    blob (~400 arrays) hashed in 5.0 s beside a busy thread, 2.1 s alone. The interval is
    process-wide: the first hash lowers it, the last one restores it."""
    with _handoff["lock"]:
        _handoff["users"] += 1 if on else -1
        if on and _handoff["users"] == 1:
            _handoff["saved"] = sys.getswitchinterval()
            sys.setswitchinterval(min(_handoff["saved"], 2e-4))
        elif not on and _handoff["users"] == 0:
            sys.setswitchinterval(_handoff["saved"])


class Blob:
    """The safetensors encoding of name -> array (sorted by name) and its sha256."""

    def __init__(self, tensors: dict):
        header, offset, self.arrays = {}, 0, []
        for name in sorted(tensors):
            arr = tensors[name]
            assert arr.flags.c_contiguous, name
            dt = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}[arr.dtype]
            header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
            offset += arr.nbytes
            self.arrays.append((name, arr))
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        self.head = struct.pack("<Q", len(text)) + text
        self.length = len(self.head) + offset
        self._digest = None
        self._thread = None

    def same(self, tensors: dict) -> bool:
        """Does this blob hold exactly these arrays (the same objects)?"""
        return len(tensors) == len(self.arrays) and all(tensors.get(n) is a for n, a in self.arrays)

    def _hash(self):
        _quick_handoff(True)
        try:
            h = hashlib.sha256(self.head)
            for _, arr in self.arrays:
                h.update(memoryview(arr.reshape(-1)).cast("B"))  # no copy; releases the GIL
            self._digest = h.hexdigest()
        finally:
            _quick_handoff(False)

    def start_hash(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._hash, name="blob sha256", daemon=True)
            self._thread.start()

    def sha256(self) -> str:
        self.start_hash()
        self._thread.join()
        return self._digest

    def copies(self, addr: int):
        """(destination, source, bytes) tasks that put the blob at address `addr`."""
        yield addr, self.head, len(self.head)
        at = addr + len(self.head)
        for _, arr in self.arrays:
            src, n = arr.ctypes.data, arr.nbytes
            for o in range(0, n, CHUNK):
                yield at + o, src + o, min(CHUNK, n - o)
            at += n


def package_bytes(head_of, blob: Blob) -> bytes:
    """head | blob | sha256(head) as one new bytes object. `head_of(digest)` is the bytes
    before the blob given the blob's sha256; its length must not depend on the digest:
    the copies start before the hash is done."""
    blob.start_hash()
    head_len = len(head_of("0" * 64))
    total = head_len + blob.length + 32
    out = _new_bytes(None, total)
    addr = _bytes_address(out)
    tasks = iter(list(blob.copies(addr + head_len)))
    lock = threading.Lock()
    copied = []

    def copy():
        while True:
            with lock:
                task = next(tasks, None)
            if task is None:
                return
            _memmove(*task)
            copied.append(task[2])

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cpus = max(1, min(cpus, 8))  # more copies in flight than that only queue for memory
    workers = []

    def more(n):
        for _ in range(n):
            workers.append(threading.Thread(target=copy, name="blob copy", daemon=True))
            workers[-1].start()
    try:
        more(max(1, cpus - 1))  # the hash, if still running, holds a core; copies take the rest
        head = head_of(blob.sha256())
        more(cpus - len(workers))  # ... then all of them
    finally:
        for w in workers:  # never let `out` go while a thread still writes into it
            w.join()
    if len(head) != head_len or sum(copied) != blob.length:
        raise AssertionError("package bytes: the head changed length, or a copy failed")
    _memmove(addr, head, head_len)
    _memmove(addr + total - 32, hashlib.sha256(head).digest(), 32)
    return out

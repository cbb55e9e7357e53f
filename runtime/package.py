"""Loading a package file: every index, size and offset is checked before the GPU objects made
from it exist.

A package is untrusted input. `Package.load` checks the magic, format version,
lengths and checksums; then every field of the manifest, every index (buffers, kernels,
tensors) and every size against the others; then the weights blob. Anything wrong
raises PackageError naming the field. A Session made from a path checks the same, but
maps the file on POSIX instead of reading it (as safetensors and llama.cpp do: no copy of
gigabytes), checks the weights' checksums while it compiles and uploads, and returns only once
they pass (a file written into during the load can leave it a mix): the manifest and the
weights' offsets are checked first, the kernels and dispatches (manifest_checks.check_programs)
by the Session, which makes a gigabyte of weights' buffers meanwhile.
"""
from __future__ import annotations

import hashlib
import mmap
import os
import struct
import threading
import zlib  # noqa: F401  (tests slow its checks through this module)

import msgpack
import numpy as np

from .errors import PackageError  # noqa: F401  (importers take it from here too)
from .format import (  # noqa: F401  (importers take them from here too)
    DTYPES, F16_MAX, FORMAT_NAME, FORMAT_VERSION, MAGIC, MAX_LIFTED, MAX_MANIFEST, OFFSET_ALIGN, QUICK, READ_STEP,
    READABLE_VERSIONS, as_variant, kernels_of, tensor_bytes)
from .manifest_checks import check_layout, check_programs, validate_manifest  # noqa: F401  (validate_manifest: tests)
from .manifest_fields import fail
from .records import BufferPlan, Manifest, parse_manifest, parse_plan
from .threads import FileReader, OnThread, Stoppable
from .weights_blob import check_blob, header_end, weight_views, weights_layout
from .workgroup_memory import workgroup_bytes  # noqa: F401  (importers take it from here too)


class Package:
    """A validated package: `manifest` as stored (msgpack maps), `weights`, and the manifest as typed
    records: `plan` (buffers and tensors) and `parsed` (all of it; runtime/records.py).

    Made by `Package.load(path)` or `Package.from_bytes(data)`, which check everything in the
    file before returning (docs/PACKAGE.md); `Session(device, path)` opens a file itself.
    """

    def __init__(self, manifest: dict, weights: dict, raw_size: int = 0):
        self.manifest = manifest
        self._plan, self._parsed = None, None  # its records, parsed once when first asked for
        self._weights = weights
        self._programs_unchecked = False  # a file's kernels and programs: checked by _check_programs
        self._reading = None  # an OnThread until a file's weights are read (mapped: their layout) and checked
        self._cancel = None  # set: that read stops
        self._checks = None  # a mapped file's: () -> a check of its bytes on a thread (see _check)
        self._checking, self._fresh = None, False  # the last check started; not yet handed out
        self._verified = True  # False for a mapped file's weights until the latest check has passed
        self._mapping = None  # a mapped file's (mmap, path)
        self.raw_size = raw_size

    @property
    def weights(self) -> dict:
        """name -> read-only ndarray (params and non-zero initial state); for a package still
        being read (a Session made from a path), waits for its bytes and their checksums. A
        mapped file's are views of its pages: bytes written into it after a check has passed
        are served as they are, until the next Session's check (a rebuild) refuses them."""
        views = self._unchecked_weights()
        self._whole()
        if not self._verified:
            self._passed(self._check())  # raises PackageError for damaged weights, each time asked
        return views

    def _passed(self, checks: Stoppable, stop=None) -> None:
        """Wait for `checks` (stopping it if this thread is interrupted, or once `stop` is set:
        no check reads the file behind a call that failed); the weights are verified if it is
        still the latest check."""
        try:
            if stop is None:
                checks.wait()
            elif not checks.wait_unless(stop):
                return
        except BaseException:
            checks.stop()
            raise
        if self._checking is checks:  # (not a newer one, started meanwhile by another thread)
            self._verified = True

    def _unchecked_weights(self) -> dict:
        """The weights once their layout is checked; a mapped file's bytes maybe not yet (see _check)."""
        reading = self._reading
        if reading is not None:
            try:
                self._weights = reading.wait()  # raises PackageError for damaged weights, each time asked
            except BaseException:
                if self._checking is not None:
                    self._checking.stop()  # (nothing will use these bytes: no thread reads them on)
                raise
            self._reading = None
        return self._weights

    def _check(self) -> Stoppable | None:
        """For a mapped file (a Session made from a path), a check of its weights' bytes against
        their checksums, on threads: the one started when it was mapped, then a new one each
        time (each Session uploading them, and `weights` after a check failed: the file may have
        been written into, or cut short (PackageError, at once), since; until one passes
        `weights` is not served); None for a package in memory (checked when it was read)."""
        if self._checks is None:
            return None
        self._whole()
        if not self._fresh:
            self._verified = False
            self._checking = self._checks()
        self._fresh = False
        return self._checking

    def _whole(self) -> None:
        """A mapped file cut short since it was mapped: PackageError now, before a read of its
        missing pages stops the process (SIGBUS)."""
        if self._mapping is not None and self._mapping[0].size() < self.raw_size:
            fail(f"cannot read package {self._mapping[1]}: the file was cut short to {self._mapping[0].size()} "
                  f"bytes (of {self.raw_size}) while mapped; replace a package by a rename, not by writing into it")

    def while_checked(self, use, stop=None) -> None:
        """use(weights): for a mapped file beside a check of their bytes, then that check's
        verdict (PackageError: damaged weights) before it returns; `stop` (an Event), once set,
        ends the check and this, unverified (the Session that asked has failed)."""
        checks = self._check()
        if checks is None:
            use(self.weights)
            return
        try:
            use(self._unchecked_weights())
        except BaseException:
            checks.stop()  # (no check outlives a Session that failed)
            raise
        self._passed(checks, stop)

    def weights_at_hand(self) -> bool:
        """Whether `while_checked` hands the weights over without waiting for the file to be read:
        in memory, or mapped (their bytes checked beside their use)."""
        return self._reading is None or self._checks is not None

    def abandon(self) -> None:
        """Stop reading a file's weights that nobody will upload (a Session that failed to load)."""
        if self._reading is not None:
            self._cancel.set()
            self._reading.join()
        if self._checking is not None:
            self._checking.stop()

    def _check_programs(self) -> None:
        """The kernels' and programs' checks of a file opened without them (a Session makes and
        fills a gigabyte of weights' buffers meanwhile); nothing for a package checked whole."""
        if self._programs_unchecked:
            _checked(check_programs, self.manifest)
            self._programs_unchecked = False

    @classmethod
    def load(cls, path) -> Package:
        """Read and check a .mnpk file, whole, into memory (writing over the file later changes nothing).

        Args:
            path: the package file.

        Returns:
            The Package.

        Raises:
            PackageError: the file is damaged, from an incompatible compiler, or inconsistent.
            OSError: the file cannot be read.
        """
        package = cls._open(path, mapped=False)  # in memory: a file written over later changes nothing
        package.weights  # noqa: B018  (checked whole before it returns)
        return package

    @classmethod
    def _open(cls, path, mapped: bool = True, programs: bool = True) -> Package:
        """The manifest read and checked now (without `programs`, its kernels and programs only
        by _check_programs); the weights read (or mapped), their layout and
        bytes checked against their checksums, on threads (a Session made from a path makes its
        pipelines and buffers meanwhile: the manifest they come from is checked, and it returns
        only once `weights` or its own check has passed). Mapped: the file is replaced by a
        rename (as `meganeura compile` writes it), never truncated, while a Session holds it."""
        try:
            f = open(path, "rb")
        except OSError as exc:
            raise PackageError(f"cannot read package {path}: {exc.strerror or exc}") from None
        try:
            size = os.fstat(f.fileno()).st_size
            read = FileReader(f, size, lambda why: PackageError(f"cannot read package {path}: {why}"))
            manifest, start, end = _head(read.bytes, size, programs)
            plan = parse_plan(manifest)  # (the reading thread checks the weights against it)
            blob = _mapped(f, start, end, path) if mapped and end > start else None
            if blob is None:
                try:
                    blob = memoryview(np.empty(end - start, np.uint8))  # untouched pages (FileReader says why)
                except MemoryError:
                    raise PackageError(f"package {path}: {end - start} bytes of weights do not fit in memory") from None
                mapped = False
        except BaseException:
            f.close()
            raise
        package = cls(manifest, None, size)
        package._plan = plan
        package._programs_unchecked = not programs
        package._cancel = cancel = threading.Event()
        ck = plan.checksum
        if mapped:
            f.close()  # (the mapping holds the file)
            package._mapping = (blob.obj, path)
            package._checks = lambda: Stoppable(lambda stop: check_blob(blob, ck, 0, len(blob), stop))
            package._checking, package._fresh, package._verified = package._checks(), True, False

            def layout():  # the header's chunks checked (the whole blob's check is running beside)
                head = header_end(blob, ck.chunk_bytes)
                check_blob(blob, ck, 0, head, cancel)
                return weight_views(blob, weights_layout(blob[:head], len(blob), plan))
            package._reading = OnThread(layout)
            return package

        def rest():
            with f:
                # the chunks holding the safetensors header first: its offsets are checked first
                head = min(len(blob), ck.chunk_bytes)
                read.into(blob, start, 0, head, READ_STEP, cancel)
                more = header_end(blob, ck.chunk_bytes)  # (a header longer than a chunk: the chunks up to its end)
                if more > head:
                    read.into(blob, start, head, more, READ_STEP, cancel)
                    head = more
                check_blob(blob, ck, 0, head, cancel)
                layout = weights_layout(blob[:head], len(blob), plan)
                read.into(blob, start, head, len(blob), READ_STEP, cancel)
            check_blob(blob, ck, head, len(blob), cancel)
            return weight_views(blob, layout)
        package._reading = OnThread(rest)
        return package

    @classmethod
    def from_bytes(cls, data: bytes) -> Package:
        """Check a package held in memory (e.g. the bytes compile_model returned).

        Args:
            data: the package file's bytes.

        Returns:
            The Package; its weights are read-only views of `data`.

        Raises:
            PackageError: damaged, from an incompatible compiler, or inconsistent bytes.
        """
        return cls._parse(bytes(data))  # a copy unless it is bytes already: the weights view it

    @classmethod
    def _parse(cls, data) -> Package:
        """`data`: the package's bytes (bytes, or a view of memory nobody else holds)."""
        manifest, start, end = _head(lambda a, b: data[a:b], len(data))
        blob = memoryview(data)[start:end]
        package = cls(manifest, None, len(data))
        check_blob(blob, package.plan.checksum, 0, len(blob))
        package._weights = weight_views(blob, weights_layout(blob, len(blob), package.plan))
        return package

    @property
    def plan(self) -> BufferPlan:
        """The buffers, the tensors in them and the device's requirements, as typed records."""
        if self._plan is None:
            self._plan = parse_plan(self.manifest)
        return self._plan

    @property
    def parsed(self) -> Manifest:
        """The whole manifest as typed records (a file opened without its kernels' and programs'
        checks has them run first)."""
        if self._parsed is None:
            self._check_programs()
            self._parsed = parse_manifest(self.manifest, self.plan)
        return self._parsed

    @property
    def programs(self) -> dict:
        """The manifest's programs as stored (name -> map; `parsed.programs` holds them as records)."""
        return self.manifest["programs"]

    @property
    def tensors(self) -> list:
        """The manifest's tensors as stored (maps; `plan.tensors` holds them as records)."""
        return self.manifest["tensors"]

    def param_names(self) -> list:
        """The parameters' names, as in the source model."""
        return self.plan.param_names()

    def summary(self) -> str:
        """What `meganeura info` prints: sizes, parameters, programs, kernels, training."""
        from .package_summary import summary

        return summary(self.parsed, self.raw_size)


def _head(read, size: int, programs: bool = True):
    """(manifest, blob start, blob end) of a package of `size` bytes, `read(a, b)` giving bytes
    a to b: the magic, version, lengths and the checksum over the head, then every field (but
    the kernels' and programs' without `programs`: Package._check_programs)."""
    if size < len(MAGIC) + 12 + 8 + 32:
        fail(f"not a meganeura package: {size} bytes is too short")
    first = read(0, 20)
    if first[:8] != MAGIC:
        fail("not a meganeura package: wrong magic bytes")
    version, man_len = struct.unpack_from("<IQ", first, 8)
    if version not in READABLE_VERSIONS:
        fail(f"package format version {version}; this runtime reads versions {READABLE_VERSIONS}: "
              "recompile the model with a matching meganeura")
    if man_len > MAX_MANIFEST or 20 + man_len + 8 + 32 > size:
        fail(f"truncated or damaged package: manifest length {man_len} exceeds the file")
    head = read(0, 20 + man_len + 8)
    (blob_len,) = struct.unpack_from("<Q", head, 20 + man_len)
    end = 20 + man_len + 8 + blob_len
    if end + 32 != size:
        fail(f"truncated or damaged package: expected {end + 32} bytes, file has {size}")
    if hashlib.sha256(head).digest() != read(end, end + 32):
        fail("damaged package: the checksum does not match the contents")
    try:
        manifest = msgpack.unpackb(head[20:20 + man_len], raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for bad bytes
        raise PackageError(f"damaged manifest: {type(exc).__name__}: {exc}") from None
    _checked(check_layout, manifest)
    if programs:
        _checked(check_programs, manifest)
    return manifest, 20 + man_len + 8, end


def _checked(check, manifest) -> None:
    try:
        check(manifest)
    except PackageError:
        raise
    except Exception as exc:  # a case the checks missed: still the file's fault
        raise PackageError(f"invalid manifest ({type(exc).__name__}: {exc})") from None


def _mapped(f, start: int, end: int, path):
    """The file's bytes start to end as a read-only view of its mapping (the page cache's own
    pages: a read of gigabytes into fresh memory pays the first touch of every page, on cores the
    compiles want); None where it cannot or should not be mapped (the caller reads it instead)."""
    if os.name != "posix":  # (Windows: a mapped file cannot be replaced, so a new package renamed onto it would fail)
        return None
    try:
        whole = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError, OverflowError):  # (a file system without mappings; a 32-bit process)
        return None
    if len(whole) < end + 32:  # cut short since its head was read
        fail(f"cannot read package {path}: the file ended at byte {len(whole)} of {end + 32} while being read")
    return memoryview(whole)[start:end]

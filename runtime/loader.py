"""Loading a Session's first tier (Loader): every buffer but the training state's, the weights
written into them, and the pipelines and bind groups of what runs first.

The driver compiles pipelines on threads, bind groups are made on one more beside them, and the
buffers are made and the weights written on this thread once the compiles are queued, or, from
BIG_UPLOAD bytes of weights, on a thread of their own from the start (their upload then ends the
load): the weights' buffers as soon as their sizes are checked, the others once every check of the
kernels and dispatches has passed. Nothing runs before the last check: a refusal stops the writes,
lets the buffers go and leaves no thread behind.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from .device import runs_cpu_variants
from .device_limits import check_buffers, check_device
from .format import QUICK
from .lifted_sizes import sizes_buffer
from .threads import OnThread, in_background
from .tiers import ProgramTable, assemble, longest_first, make_bind_groups
from .training_state import TRAINING, Buffers, deferred_buffers
from .workgroup_memory import check_workgroup_memory

# threads writing the weights: each write copies into a staging buffer of the driver's, and a
# gigabyte of them (BIG_UPLOAD) goes faster on twice as many, but in a background load (its host's
# frames first); bench/REJECTED.md: weights uploaded through reused staging buffers
UPLOAD_THREADS, BIG_UPLOAD = 4, 1 << 30
# bind groups are made on one thread beside the pipelines': their making is Python, bound by the GIL,
# so more threads only queue for it, and a host's frame queues behind them
BIND_GROUP_THREADS = 1
LOAD_THREADS = 16  # most threads compiling pipelines at load (a driver spends ~15 ms on each, cold)
BIG_LOAD_THREADS = 12  # beside a gigabyte of weights' upload (which then ends the load): cores left to it


@dataclass(frozen=True)
class FirstTier:
    """What a load made, and what it leaves to the training state and the tuned tier."""

    table: ProgramTable
    device_class: str  # "cpu" or "gpu": whose kernel variants run
    variant: str  # the variant run first: the device class's, or QUICK
    later: set  # the training state's buffers (runtime/training_state.py)
    behind: set  # kernels of `variant` not made at load: the training step's own
    tuned: set  # the device class's kernels (a quick tier's successors)


class Loader:
    """Makes `package`'s first tier with `objects` (a gpu_objects.GpuObjects). `device_class`
    ("cpu", "gpu" or None: by the adapter) picks the kernel variants, `quick_start` the quick tier
    first where the package has one; `memory_limit` (bytes) refuses a package whose buffers need more."""

    def __init__(self, package, objects, device_class: str | None, memory_limit: int | None, quick_start: bool):
        self.package, self.objects, self.plan = package, objects, package.plan
        self.device_class, self.memory_limit, self.quick_start = device_class, memory_limit, quick_start
        self.uploads = self.plan.stored()
        self.stop, self.allocated, self.checked = threading.Event(), threading.Event(), threading.Event()
        self.big = sum(t.nbytes for t in self.uploads) >= BIG_UPLOAD
        self.first = sorted({t.buffer for t in self.uploads}) if self.big else []  # made at once when big
        self.upload_threads = UPLOAD_THREADS * (2 if self.big and objects.progress is None else 1)
        self.later, self.sizes_layout = set(), (0, {})  # (set before `checked`: the buffers' thread reads them)
        self.variant, self.programs, self.used, self.behind, self.tuned = None, None, set(), set(), set()
        self._filled = self._pipelines = self._groups = None
        check_buffers(self.plan, objects.device, memory_limit)  # every buffer's size, before any allocation

    def load(self) -> FirstTier:
        """The first tier, once every buffer is made and every weight written (each thread joined)."""
        try:
            self._filled = OnThread(self._buffers_and_weights, "meganeura-upload") if self.big else None
            self._check()
            self._start_compiles()
            if self._filled is None:
                self._buffers_and_weights()
            else:
                self._filled.wait()
        except BaseException:
            self._abort()  # no thread outlives the constructor; the upload's error is the one to see
            raise
        try:
            kernels = self._pipelines()
        except BaseException:
            self.stop.set()
            self._groups.join()
            raise
        planned, groups = self._groups.wait()
        table = ProgramTable(QUICK if self.variant == QUICK else "tuned", kernels, groups,
                             assemble(planned, kernels, groups))
        return FirstTier(table, self.device_class, self.variant, self.later, self.behind, self.tuned)

    def _check(self) -> None:
        """Every check left (the kernels and dispatches, against the device's limits too), then which
        kernels run first; the other buffers may be made after it."""
        m, device = self.package.parsed, self.objects.device  # (its kernels' and programs' checks first)
        self.sizes_layout = check_device(m, device, self.memory_limit)  # (the kernels' and dispatches' sizes)
        self.later = deferred_buffers(m)  # the training state: made after the load (runtime/training_state.py)
        if self.device_class is None:  # CPU rasterisers (lavapipe) rank kernels differently
            cpu = device.adapter.info.get("adapter_type") == "CPU" and runs_cpu_variants(device)
            self.device_class = "cpu" if cpu else "gpu"
        elif self.device_class == "cpu" and not runs_cpu_variants(device):
            raise ValueError("device_class='cpu' needs a device with the 'subgroup' feature and 8-lane subgroups "
                             "(a CPU rasteriser such as lavapipe); this one runs the 'gpu' kernels")
        self.tuned, self.variant = m.kernels_of(self.device_class), self.device_class
        if self.quick_start and self.device_class == "gpu" and any(
                QUICK in d.variants for p in m.programs.values() for d in p.dispatches):
            self.variant = QUICK  # (CPU rasterisers run their own variants)
        self.programs = [name for name in m.programs if name != TRAINING] if self.later else None
        self.used = m.kernels_of(self.variant, self.programs)  # the training step's own: made with its state
        self.behind = m.kernels_of(self.variant) - self.used
        check_workgroup_memory(m.kernels, self.used | self.behind | self.tuned,
                               device.limits.get("max-compute-workgroup-storage-size", 16384))
        self.checked.set()  # (the manifest and the device's limits all checked: the other buffers may be made)

    def _start_compiles(self) -> None:
        """The pipelines of what runs first compiled on threads, and their bind groups made on one
        more once the buffers are (the layouts of the others made meanwhile, here)."""
        m, objects, progress = self.package.parsed, self.objects, self.objects.progress
        todo = [(i, k) for i, k in enumerate(m.kernels) if i in self.used]
        if progress is not None:
            progress.expect(len(todo) + len(self.uploads))
        for i in self.used:
            objects.layout(m.kernels[i])  # shared by kernels: made here, not in the threads
        threads = None if progress is None else min(progress.threads, LOAD_THREADS)  # (a background load's)
        self._pipelines = load_calls({i: (objects.pipeline, i, k) for i, k in longest_first(todo)}, threads,
                                     min(BIG_LOAD_THREADS, LOAD_THREADS) if self.big else LOAD_THREADS)
        self._groups = OnThread(lambda: make_bind_groups(objects, m, self.variant, BIND_GROUP_THREADS, {}, self.stop,
                                                         self.allocated, self.programs), "meganeura-bind")
        for i in (self.behind | self.tuned) - self.used:  # (needed after the load)
            objects.layout(m.kernels[i])

    def _abort(self) -> None:
        self.stop.set()
        self.allocated.set()  # (the bind thread, stopped, makes no group)
        self.checked.set()
        if self._filled is not None:
            self._filled.join()
        if self._pipelines is not None:
            self._pipelines(quiet=True)
        if self._groups is not None:
            self._groups.join()

    def _buffers_and_weights(self) -> None:
        """The buffers made (the weights' first when big) and the weights written."""
        made, pkg, stop = {}, self.package, self.stop
        try:
            made.update(self.objects.allocate(self.first, "the package's weights", stop))
        except BaseException:
            made.clear()
            stop.set()
            self.allocated.set()
            raise
        # a gigabyte of weights at hand is written from now on, while this thread makes the other buffers
        # once every check has passed; other weights once every buffer is made (a file being read: not
        # behind its read)
        early = bool(self.first) and pkg.weights_at_hand()
        if not early:
            self._other_buffers(made)
        if stop.is_set():  # (the load failed meanwhile)
            return
        with self.objects.guard("uploading the weights"):  # (a mapped file's checked beside it: nothing runs first)
            pkg.while_checked(lambda weights: self._upload(
                weights, dict(made), (lambda: self._other_buffers(made)) if early else None), stop)

    def _other_buffers(self, made: dict) -> None:
        """The buffers `made` lacks (but the training state's), once every check has passed; then `allocated`."""
        objects, count, stop = self.objects, len(self.plan.buffers), self.stop
        try:
            self.checked.wait()
            if not stop.is_set():
                now = [i for i in range(count) if i not in self.later and i not in made]
                made.update(objects.allocate(now, "the package", stop, self.first))
            if not stop.is_set():
                objects.buffers = Buffers(made, count, self.later)
                with objects.guard("making the package's buffers"):
                    objects.sizes = sizes_buffer(objects.device, self.sizes_layout)
                objects.allocated_bytes += self.sizes_layout[0]
        except BaseException:
            made.clear()  # (let go now, not when the traceback holding this frame is)
            stop.set()  # (before `allocated`: the bind thread, stopped, makes no group)
            raise
        finally:
            self.allocated.set()

    def _upload(self, weights: dict, into: dict, meanwhile=None) -> None:
        """Write the weights into buffers `into` (index -> buffer), the largest first, on
        `upload_threads` threads; none once `stop` is set (the load failed). `meanwhile()` runs on
        this thread beside them."""
        order = sorted(self.uploads, key=lambda t: -weights[t.name].nbytes)
        writes = load_calls({i: (self._write_counted, t, weights[t.name], into) for i, t in enumerate(order)},
                            self.upload_threads)
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:
                self.stop.set()
                writes(quiet=True)
                raise
        writes()

    def _write_counted(self, t, value, into: dict) -> None:
        if self.stop.is_set():
            return
        self.objects.write(t, value, into)
        if self.objects.progress is not None:
            self.objects.progress.tick()


def load_calls(calls: dict, threads: int | None = None, most: int | None = None):
    """threads.in_background on `threads` threads (default: `most`, else LOAD_THREADS, or this
    one, when asked, for 8 calls or fewer)."""
    return in_background(calls, threads if threads is not None else (most or LOAD_THREADS) if len(calls) > 8 else 0)

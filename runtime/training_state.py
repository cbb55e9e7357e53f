"""A training package's training state made just after its load, on threads of its own.

The buffers only the training step binds (gradients, optimizer moments, the activations its
backward pass keeps, its labels) are most of a training package's memory, and the kernels only it
runs are most of its pipelines. A Session returns once what inference needs is made (its
pipelines, the weights uploaded) and makes the rest behind it, as PyTorch makes an optimizer's
state at its first step; whatever uses the training step, or one of those buffers, before they
exist waits for them (`Session.training_ready` says whether it would), and a kernel of its that
the WGSL compiler rejects is raised there (`training_error`), inference running on.
"""
from __future__ import annotations

import threading

from .records import Manifest, parse_manifest
from .threads import OnThread, Stoppable, again, in_background
from .tiers import ProgramTable, assemble, longest_first, make_bind_groups

TRAINING = "train_step"


def deferred_buffers(manifest: Manifest | dict) -> set:
    """The buffers only the training program uses (none holding the package's weights); none
    when the package has no other program to run first. (A checked manifest as stored is parsed.)"""
    m = parse_manifest(manifest) if isinstance(manifest, dict) else manifest
    if TRAINING not in m.programs or len(m.programs) == 1:
        return set()
    now = {t.buffer for t in m.tensors if t.init == "blob"}
    for name, p in m.programs.items():
        if name != TRAINING:
            now.update(b.buffer for d in p.dispatches for b in d.bindings)
            now.update(t.buffer for t in (*p.inputs.values(), *p.outputs.values()))
    return set(range(len(m.buffers))) - now


class Buffers:
    """A Session's buffers by index, where those in `later` are made by a TrainingState: an
    index not made yet waits for them (or raises what stopped them)."""

    def __init__(self, made: dict, count: int, later: set):
        self._items = [made.get(i) for i in range(count)]
        self._later, self._ready, self.error = later, threading.Event(), None
        if not later:
            self._ready.set()

    def fill(self, made: dict) -> None:
        for i, b in made.items():
            self._items[i] = b
        self._ready.set()

    def fail(self, error: BaseException) -> None:
        """No more of them: those made are let go (released: nothing ran with them yet)."""
        self.error = error  # (first: a reader finding None below then raises it)
        for i in self._later:
            self._items[i] = None
        self._ready.set()

    def wait(self) -> None:
        self._ready.wait()
        if self.error is not None:
            raise again(self.error, "the training state was not made")

    def __getitem__(self, i):
        b = self._items[i]
        if b is None and i % len(self._items) in self._later:
            self.wait()
            b = self._items[i]
        return b

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        if self._later:
            self.wait()
        return iter(self._items)


class TrainingState:
    """Makes the deferred buffers (`later`) with `objects` (a Session's gpu_objects.GpuObjects), and the
    pipelines of `kernels` (index -> KernelInfo: those only the training program runs as `variant`)
    on `threads` threads beside them, then the training program's bind groups, and adds them to
    `table` (a quick_start Session's tuned tier compiles once these compiles end, and waits for the
    rest before it swaps), on threads started at once."""

    def __init__(self, objects, table: ProgramTable, manifest: Manifest, later: set, variant: str, kernels: dict,
                 threads: int):
        self.objects, self.table, self.manifest = objects, table, manifest
        self.error, self.program = None, TRAINING
        self.compiling = set(kernels)
        self._compiles = in_background({i: (objects.pipeline, i, k, False) for i, k in longest_first(
            list(kernels.items()))}, threads, "meganeura-training")
        self.compiled = OnThread(self._compiles, "meganeura-training")
        self._thread = Stoppable(lambda cancel: self._make(later, variant, cancel), name="meganeura-training")

    def _make(self, later, variant, cancel):
        objects, made = self.objects, {}
        try:
            made = objects.allocate(sorted(later), "the training state", cancel)
            if cancel.is_set():  # (the Session is closing)
                raise RuntimeError("this session was closed")
            objects.buffers.fill(made)
            forms, groups = make_bind_groups(objects, self.manifest, variant, 1, self.table.groups, cancel,
                                             programs=(TRAINING,))
            kernels = self.compiled.wait()
            if cancel.is_set():
                raise RuntimeError("this session was closed")
            programs = assemble(forms, {**self.table.kernels, **kernels}, groups)
        except BaseException as exc:  # noqa: BLE001  (raised where the training step is asked for)
            self.error = RuntimeError("this session was closed") if cancel.is_set() else exc  # (its compiles
            # cancelled: what stopped them)
            self._compiles(quiet=True)  # (of no use now)
            objects.let_go(made)
            objects.buffers.fail(exc)
            return
        self.table.extend(kernels, groups, programs)  # (before a tuned tier's swap: it waits for this)

    @property
    def done(self) -> bool:
        return self._thread.done()

    def join(self) -> None:
        self._thread.join()

    def wait(self) -> None:
        """Wait for it; raises what stopped it (e.g. GPUOutOfMemoryError: inference runs on)."""
        self._thread.join()
        if self.error is not None:
            raise again(self.error, "the training state was not made")

    def cancel(self) -> None:
        self._thread.stopping.set()  # (first: whatever stops now reads as the session closing)
        self._compiles(quiet=True)  # (those begun end; the others are cancelled)
        self._thread.stop()
        self.compiled.join()

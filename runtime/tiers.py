"""A Session's programs as its pipelines and bind groups (a ProgramTable), and the quick tier
(Session(quick_start=True)): the driver compiles few, cheap kernels first (each GEMM's
igemm_quick, other kernels lifted into fewer, compiler/codegen/lift_sizes.quick_tier), so that a
first launch runs sooner; the tuned kernels compile behind them on threads and replace them in
every program at once, between two of the host's recordings."""
from __future__ import annotations

import threading
import warnings

from .records import BindGroupKey, Manifest
from .threads import OnThread, again, in_background


class ProgramTable:
    """What record() encodes and the GPU objects behind it: `kernels` (kernel index -> (pipeline,
    bind group layout)), `groups` (BindGroupKey -> bind group), `steps` (program -> [(pipeline,
    bind group, workgroups, their native handles)]) and `tier` ("quick" or "tuned"). The training
    state adds its program; the tuned tier replaces them all at once (record() takes a program's
    steps whole: a recording has one tier or the other)."""

    def __init__(self, tier: str, kernels: dict, groups: dict, steps: dict):
        self.tier, self.kernels, self.groups, self.steps = tier, kernels, groups, steps
        self.retired = []  # earlier tiers' steps: their objects kept until the Session closes

    def extend(self, kernels: dict, groups: dict, steps: dict) -> None:
        """More programs' steps (`groups`: all the groups, those known before among them)."""
        self.kernels = {**self.kernels, **kernels}
        self.groups = groups
        self.steps = {**self.steps, **steps}

    def replace(self, tier: str, kernels: dict, groups: dict, steps: dict) -> None:
        self.retired.append(self.steps)
        self.kernels, self.groups, self.steps, self.tier = kernels, groups, steps, tier

    def clear(self) -> None:
        self.kernels, self.groups, self.steps, self.retired = {}, {}, {}, []


def forms(manifest: Manifest, variant: str, programs=None) -> dict:
    """Program (of `programs`, names; default all) -> [(each dispatch's Launch as `variant` runs it,
    its bind group's key)]."""
    kernels, out = manifest.kernels, {}
    for name, p in manifest.programs.items():
        if programs is None or name in programs:
            steps = out[name] = []
            for d in p.dispatches:
                launch = d.as_variant(variant)
                steps.append((launch, BindGroupKey(kernels[launch.kernel].layout, d.bindings, launch.lifted)))
    return out


def make_bind_groups(objects, manifest: Manifest, variant: str, threads: int, known: dict, cancel: threading.Event,
                     allocated: threading.Event | None = None, programs=None) -> tuple:
    """(forms(manifest, variant, programs), key -> bind group): the groups `known` lacks made by
    `objects` (a Session's gpu_objects.GpuObjects) on `threads` threads (1: this one), or none more
    once `cancel` is set. Its keys are a thread's work too (thousands of dispatches for a big model),
    done while the session's buffers are made; the groups once `allocated` is set."""
    planned = forms(manifest, variant, programs)

    def bind(name, j, key):
        return None if cancel.is_set() else objects.bind_group(name, j, key)
    calls = {}  # bind group key -> the first dispatch using it (pooled scratch makes many bind alike)
    for name, steps in planned.items():
        for j, (_, key) in enumerate(steps):
            if key not in known:
                calls.setdefault(key, (bind, name, j, key))
    if allocated is not None:
        allocated.wait()
    # (one thread: this one, in a loop; a pool of one worker hands each group across threads, which
    # costs more than the group's own making)
    return planned, {**known, **in_background(calls, threads if threads > 1 else 0)()}


def longest_first(todo: list) -> list:
    """(index, KernelInfo) pairs, the longest WGSL first (a driver takes longest on the biggest
    GEMMs): no long compile starts last and holds up a tier alone."""
    return sorted(todo, key=lambda ik: -len(ik[1].wgsl))


def assemble(planned: dict, kernels: dict, groups: dict) -> dict:
    """Program -> [(pipeline, bind group, workgroups, their native handles)], what record() encodes."""
    programs = {}
    for name, steps in planned.items():
        programs[name] = []
        for launch, key in steps:
            pipeline, group = kernels[launch.kernel][0], groups[key]
            programs[name].append((pipeline, group, launch.workgroups,
                                   getattr(pipeline, "_internal", None), getattr(group, "_internal", None)))
    return programs


class TunedTier:
    """The tuned kernels (`used`, those of the Session's device class `variant`) made by `objects`
    on `threads` threads behind a Session running its quick tier (after the training step's own
    quick kernels, `training`: runtime/training_state.py), their bind groups made, then every
    program of `table` swapped at once. The quick tier's objects are kept until the Session closes.
    If the tuned kernels cannot be made (a kernel the WGSL compiler rejects, memory), the Session
    goes on with its quick tier: a RuntimeWarning says so, and wait_tuned() raises the error."""

    def __init__(self, objects, table: ProgramTable, manifest: Manifest, training, variant: str, used: set,
                 threads: int, bind_threads: int):
        self.objects, self.table, self.manifest, self.training = objects, table, manifest, training
        self.error, self._variant, self._used = None, variant, used
        self._bind_threads, self._threads = bind_threads, threads
        self._cancel, self._lock, self._compiles = threading.Event(), threading.Lock(), None
        self._thread = OnThread(self._swap_in, name="meganeura-tuned")

    def _compile(self) -> dict:
        """The tuned kernels' pipelines, begun once the training step's own end (it waits for
        those; one pool at a time keeps the host's cores as the Session was told)."""
        m, training = self.manifest, self.training
        todo = self._used - set(self.table.kernels)
        if training is not None:  # not those it compiles, but for what the other programs run (whatever becomes of it)
            others = [p for p in m.programs if p != training.program]
            todo -= training.compiling - m.kernels_of(self._variant, others)
        calls = {i: (self.objects.pipeline, i, k, False) for i, k in longest_first([(i, m.kernels[i]) for i in todo])}
        while training is not None and not training.compiled.done() and not self._cancel.wait(0.005):
            pass
        with self._lock:  # (cancel() finds the pool made here, or this finds it cancelled)
            if self._cancel.is_set():
                raise RuntimeError("this session was closed")
            self._compiles = in_background(calls, self._threads, "meganeura-tuned")
        return self._compiles()

    def _swap_in(self):
        table = self.table
        try:
            compiled = self._compile()
            if self.training is not None:  # its program made with the quick tier first, then swapped with the rest
                self.training.join()
            made = {**table.kernels, **compiled}  # (the training step's own kernels among them, once it is made)
            planned, groups = make_bind_groups(self.objects, self.manifest, self._variant, self._bind_threads,
                                               table.groups, self._cancel, programs=tuple(table.steps))
            steps = assemble(planned, made, groups)
        except BaseException as exc:  # noqa: BLE001  (wait_tuned() raises it; the quick tier runs on)
            if not self._cancel.is_set():
                self.error = exc
                warnings.warn(f"meganeura: the tuned kernels were not made ({type(exc).__name__}: {exc}); "
                              "this session keeps running its quick tier", RuntimeWarning, stacklevel=1)
            return
        if not self._cancel.is_set():
            table.replace("tuned", made, groups, steps)

    def wait(self, timeout: float | None = None) -> None:
        self._thread.wait(timeout)
        if self.error is not None:
            raise again(self.error, "the tuned kernels were not made")

    def stop_soon(self) -> None:
        """Start nothing more (cancel() then waits): a Session closing sets it first."""
        self._cancel.set()

    def cancel(self) -> None:
        """Stop compiling what has not started, and wait for what has (a Session closing)."""
        self._cancel.set()
        with self._lock:
            compiles = self._compiles
        if compiles is not None:
            compiles(quiet=True)
        self._thread.join()

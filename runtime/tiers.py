"""A Session's programs as its pipelines and bind groups, and the quick tier
(Session(quick_start=True)): the driver compiles few, cheap kernels first (each GEMM's
igemm_quick, other kernels lifted into fewer, compiler/lift_sizes.quick_tier), so that a first
launch runs sooner; the tuned kernels compile behind them on threads and replace them in every
program at once, between two of the host's recordings."""
from __future__ import annotations

import threading
import warnings

from .format import kernels_of
from .threads import OnThread, again, in_background


def make_bind_groups(session, variant: str, threads: int, known: dict, cancel: threading.Event,
                     allocated: threading.Event | None = None, programs=None) -> tuple:
    """(program -> [(each dispatch as `variant` runs it, its bind group's key)], key -> bind
    group) for `programs` (names; default all): the groups `known` lacks made on `threads`
    threads (1: this one), or none more once `cancel` is set. Its keys are a thread's work too
    (~5,600 dispatches for SD-1.5's package), done while the session's buffers are made; the
    groups once `allocated` is set."""
    forms = session._forms(variant, programs)

    def bind(name, j, key):
        return None if cancel.is_set() else session._bind_group(name, j, *key)
    calls = {}  # bind group key -> the first dispatch using it (pooled scratch makes many bind alike)
    for name, steps in forms.items():
        for j, (_, key) in enumerate(steps):
            if key not in known:
                calls.setdefault(key, (bind, name, j, key))
    if allocated is not None:
        allocated.wait()
    # (one thread: this one, in a loop; a pool of one worker handed each group across threads,
    # 3-4x the group's own ~10 us on a lavapipe host, and more beside a load's compile threads)
    return forms, {**known, **in_background(calls, threads if threads > 1 else 0)()}


def longest_first(todo: list) -> list:
    """(index, kernel) pairs, the longest WGSL first (NVIDIA took 100-240 ms on the 8x8-per-thread
    GEMMs, ~12 on most): no long compile starts last and holds up a tier alone."""
    return sorted(todo, key=lambda ik: -len(ik[1]["wgsl"]))


def assemble(forms: dict, kernels: dict, groups: dict) -> dict:
    """Program -> [(pipeline, bind group, workgroups, their native handles)], what record() encodes."""
    programs = {}
    for name, steps in forms.items():
        programs[name] = []
        for d, key in steps:
            pipeline, group = kernels[d["kernel"]][0], groups[key]
            programs[name].append((pipeline, group, tuple(d["workgroups"]),
                                   getattr(pipeline, "_internal", None), getattr(group, "_internal", None)))
    return programs


class TunedTier:
    """The tuned kernels (`used`, the Session's device class's) compiled on `threads` threads
    behind a Session running its quick tier (after the training step's own quick kernels,
    runtime/training_state.py), their bind groups made, then every program swapped at once
    (record() takes a program's list whole: a recording has one tier or the other, and both
    compute the same). The quick tier's objects are kept until the Session closes. If the
    tuned kernels cannot be made (a kernel the WGSL compiler rejects, memory), the Session
    goes on with its quick tier: a RuntimeWarning says so, and wait_tuned() raises the error."""

    def __init__(self, session, used: set, threads: int, bind_threads: int):
        self.session, self.error, self._bind_threads, self._threads = session, None, bind_threads, threads
        self._cancel, self._lock, self._compiles = threading.Event(), threading.Lock(), None
        self._used = used
        self._thread = OnThread(self._swap_in, name="meganeura-tuned")

    def _compile(self) -> dict:
        """The tuned kernels' pipelines, begun once the training step's own end (it waits for
        those; one pool at a time keeps the host's cores as the Session was told)."""
        s = self.session
        m, training = s.package.manifest, s._training
        todo = self._used - set(s.kernels)
        if training is not None:  # not those it compiles, but for what the other programs run (whatever becomes of it)
            others = [p for p in m["programs"] if p != training.program]
            todo -= training.compiling - kernels_of(m, s.device_class, others)
        calls = {i: (s._pipeline, i, k, False) for i, k in longest_first([(i, m["kernels"][i]) for i in todo])}
        while training is not None and not training.compiled.done() and not self._cancel.wait(0.005):
            pass
        with self._lock:  # (cancel() finds the pool made here, or this finds it cancelled)
            if self._cancel.is_set():
                raise RuntimeError("this session was closed")
            self._compiles = in_background(calls, self._threads, "meganeura-tuned")
        return self._compiles()

    def _swap_in(self):
        s = self.session
        try:
            compiled = self._compile()
            if s._training is not None:  # its program made with the quick tier first, then swapped with the rest
                s._training.join()
            made = {**s.kernels, **compiled}  # (the training step's own kernels among them, once it is made)
            forms, groups = make_bind_groups(s, s.device_class, self._bind_threads, s._groups, self._cancel,
                                             programs=tuple(s._programs))
            programs = assemble(forms, made, groups)
        except BaseException as exc:  # noqa: BLE001  (wait_tuned() raises it; the quick tier runs on)
            if not self._cancel.is_set():
                self.error = exc
                warnings.warn(f"meganeura: the tuned kernels were not made ({type(exc).__name__}: {exc}); "
                              "this session keeps running its quick tier", RuntimeWarning, stacklevel=1)
            return
        if not self._cancel.is_set():
            s._retired.append(s._programs)
            s.kernels, s._groups, s._programs, s.tier = made, groups, programs, "tuned"

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

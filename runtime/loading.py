"""A Session made on a thread of its own (Session.load_in_background), so that a game's frames
go on while the driver compiles: a first launch of ResNet-50's training package compiles for
about a second on 16 cores, which made in the render loop is a second-long frame."""
from __future__ import annotations

import inspect
import os
import sys
import threading

from .threads import OnThread

# cores a background load leaves to the host (its render and game threads). H200 host, 16
# cores, a 60 Hz loop of small GPU round trips during a first launch of ResNet-50's training
# package: 16 compile threads loaded it in 1.12-1.20 s with the worst frame 96-177 ms (two
# runs); 12 threads in 1.17-1.39 s, worst 36-59 ms (six runs; bench/load_in_background.py,
# results session12-load-in-background.json; bind groups then made on the compile threads too)
SPARE_CORES = 4
# Python's thread switch interval while background loads run (restored when the last one ends):
# a host thread calling into wgpu waits, after each call, for the loading threads' Python to
# hand the interpreter back, up to the interval each time. H200, the worst frame of a 60 Hz loop
# (~25 wgpu calls a frame) during first launches, bind groups on one thread, at Python's 5 ms
# against 0.5 ms: SmolLM2 48-65 ms (six runs) against 33-78, median 40 (five); DINOv2 11-21
# (three) against 9-28, median 12 (four); ResNet-50 19-35 (six) against 19-22 (four); loads no
# slower (bench/results session13-load-in-background.json, -experiments.json)
SWITCH_INTERVAL = 0.0005
_switch = {"lock": threading.Lock(), "loads": 0, "saved": None, "set": None}  # running loads, what they found and set


def default_threads() -> int:
    """Compile threads of a background load: the cores less SPARE_CORES (at least one)."""
    return max(1, (os.cpu_count() or 1) - SPARE_CORES)


class LoadingSession:
    """A Session being made. Each frame: `done()` (never blocks) and `progress` (0 to 1: the
    pipelines made and weights uploaded, for a progress bar); then `result()`, the Session, or
    the error that stopped it (PackageError, GPUOutOfMemoryError, ...) raised in the caller.
    Its thread is a daemon: a host that exits while it loads should call result() first (the
    driver would be stopped mid-compile)."""

    def __init__(self, session_class, device, package, threads: int | None, options: dict,
                 switch_interval: float | None):
        inspect.signature(session_class).bind(device, package, **options)  # a wrong argument: now, not at result()
        if switch_interval is not None and not switch_interval >= 1e-6:  # (Python keeps whole microseconds)
            raise ValueError(f"switch_interval must be at least 1e-6 seconds, or None; got {switch_interval!r}")
        if device is None:  # wgpu's shared default device made on the host's thread, as Session(None, ...) would
            from .device import default_device

            device = default_device()
        self._progress = _Progress(threads if threads is not None else default_threads())
        release = _switch_sooner(switch_interval) if switch_interval is not None else (lambda: None)

        def make():
            try:
                return session_class(device, package, **options, _progress=self._progress)
            finally:
                release()
        try:
            self._made = OnThread(make, "meganeura-load")
        except BaseException:
            release()  # (once only: the thread's own release, if it ran, made this one nothing)
            raise

    def done(self) -> bool:
        return self._made.done()

    def result(self, timeout: float | None = None):
        """The Session, once made (waiting up to `timeout` seconds, None: as long as it takes;
        TimeoutError after that); raises what made it fail, each time asked."""
        return self._made.wait(timeout)

    @property
    def progress(self) -> float:
        return 1.0 if self._made.done() else self._progress.fraction()


def _switch_sooner(interval: float):
    """Python's switch interval at most `interval` while this load runs (see SWITCH_INTERVAL);
    returns the load's release, which does something only the first time it is called. When
    the last load releases, the interval the first one found comes back, unless the host has
    set one of its own meanwhile."""
    with _switch["lock"]:
        now = sys.getswitchinterval()
        if _switch["loads"] == 0 or now != _switch["set"]:  # (or the host has set its own since the last load began)
            _switch["saved"] = now
        if interval < now:
            sys.setswitchinterval(interval)
        _switch["set"] = sys.getswitchinterval()
        _switch["loads"] += 1
    released = False

    def release():
        nonlocal released
        with _switch["lock"]:
            if released:
                return
            released = True
            _switch["loads"] -= 1
            if _switch["loads"] == 0 and sys.getswitchinterval() == _switch["set"] and _switch["saved"] > 0:
                sys.setswitchinterval(_switch["saved"])
    return release


class _Progress:
    """Counts what a Session's constructor has made, from its loading threads; and how many
    threads it compiles on."""

    def __init__(self, threads: int):
        self.threads = threads
        self._lock = threading.Lock()
        self._done = self._total = 0

    def expect(self, total: int) -> None:
        self._total = total

    def tick(self) -> None:
        with self._lock:
            self._done += 1

    def fraction(self) -> float:
        # (not 1.0 before done(): bind groups and the last waits follow the last tick)
        return min(0.99, self._done / self._total) if self._total else 0.0

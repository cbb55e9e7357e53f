"""A Session made on a thread of its own (Session.load_in_background), so that a game's frames
go on while the driver compiles (a first launch of a big package compiles for a second or more,
which made in the render loop is a second-long frame); and Python's thread switch interval,
shortened while a load runs when the host asks for it (`host_switch_interval`)."""
from __future__ import annotations

import inspect
import os
import sys
import threading

from .threads import OnThread

# cores a background load leaves to the host (its render and game threads): compiles on every core
# stretch the host's worst frame more than they shorten the load (bench/load_in_background.py)
SPARE_CORES = 4
# a host_switch_interval that suits a host calling into wgpu from its frame loop while a load runs:
# after each call, the host's thread waits for the loading threads' Python to hand the interpreter
# back, up to the interval each time (Python's own is 5 ms; bench/load_in_background.py measures both)
SWITCH_INTERVAL = 0.0005


class _Shortened:
    """The loads running with a host_switch_interval, the interval the first of them found, and
    the one they set (restored when the last ends, unless the host has set its own meanwhile)."""

    lock = threading.Lock()
    loads = 0
    found: float | None = None
    set_to: float | None = None


def default_threads() -> int:
    """Compile threads of a background load: the cores less SPARE_CORES (at least one)."""
    return max(1, (os.cpu_count() or 1) - SPARE_CORES)


def checked_switch_interval(host_switch_interval: float | None, alias: float | None = None) -> float | None:
    """The host_switch_interval asked for (given under its name or its older one, `switch_interval`,
    not both); ValueError unless it is None or at least a microsecond."""
    if alias is not None:
        if host_switch_interval is not None:
            raise TypeError("give host_switch_interval or switch_interval (its older name), not both")
        host_switch_interval = alias
    if host_switch_interval is not None and not host_switch_interval >= 1e-6:  # (Python keeps whole microseconds)
        raise ValueError(f"host_switch_interval must be at least 1e-6 seconds, or None; got {host_switch_interval!r}")
    return host_switch_interval


def shorten_switch_interval(host_switch_interval: float | None):
    """Python's switch interval at most `host_switch_interval` seconds while this load runs (None:
    left as it is); returns the load's release, which does something only the first time it is
    called. When the last such load releases, the interval the first one found comes back, unless
    the host has set one of its own meanwhile."""
    if host_switch_interval is None:
        return lambda: None
    state = _Shortened
    with state.lock:
        now = sys.getswitchinterval()
        if state.loads == 0 or now != state.set_to:  # (or the host has set its own since the last load began)
            state.found = now
        if host_switch_interval < now:
            _set(host_switch_interval)
        state.set_to = sys.getswitchinterval()
        state.loads += 1
    released = False

    def release():
        nonlocal released
        with state.lock:
            if released:
                return
            released = True
            state.loads -= 1
            if state.loads == 0 and sys.getswitchinterval() == state.set_to and state.found > 0:
                _set(state.found)
    return release


def _set(host_switch_interval: float) -> None:
    """The one place the runtime sets Python's switch interval: a load's, then the one it found."""
    sys.setswitchinterval(host_switch_interval)


class LoadingSession:
    """A Session being made. Each frame: `done()` (never blocks) and `progress` (0 to 1: the
    pipelines made and weights uploaded, for a progress bar); then `result()`, the Session, or
    the error that stopped it (PackageError, GPUOutOfMemoryError, ...) raised in the caller.
    Its thread is a daemon: a host that exits while it loads should call result() first (the
    driver would be stopped mid-compile)."""

    def __init__(self, session_class, device, package, threads: int | None, options: dict,
                 host_switch_interval: float | None):
        inspect.signature(session_class).bind(device, package, **options)  # a wrong argument: now, not at result()
        host_switch_interval = checked_switch_interval(host_switch_interval)
        if device is None:  # wgpu's shared default device made on the host's thread, as Session(None, ...) would
            from .device import default_device

            device = default_device()
        self._progress = Progress(threads if threads is not None else default_threads())
        release = shorten_switch_interval(host_switch_interval)

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


class Progress:
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

"""Work on threads for loading: reads of a file by several threads, a call on a thread of
its own, and a pool of callables (the compiler uses it too)."""
from __future__ import annotations

import copy
import os
import threading


class FileReader:
    """Reads of an open package file; `into` reads a range by several threads into one
    buffer: the first touch of fresh memory, not the copy out of the page cache, is what a
    read of gigabytes pays, and threads pay it in parallel (os.preadv releases the GIL)."""

    def __init__(self, f, size: int, error):
        self.f, self.size, self.error = f, size, error  # error(message) -> the exception to raise

    def bytes(self, a: int, b: int) -> bytes:
        view = memoryview(bytearray(b - a))
        self.into(view, a, 0, b - a)
        return view.tobytes()

    def into(self, view: memoryview, offset: int, a: int, b: int, step: int = 64 << 20, cancel=None) -> None:
        """File bytes offset + a to offset + b into view[a:b], `step` bytes per thread's task;
        `cancel` (a threading.Event), once set, stops it (with error("...cancelled"))."""
        def read(a, b):
            if cancel is not None and cancel.is_set():
                raise self.error("the read was cancelled")
            while a < b:
                n = os.preadv(fd, [view[a:b]], offset + a)
                if n <= 0:
                    raise self.error(f"the file ended at byte {offset + a} of {self.size} while being read")
                a += n
        fd = self.f.fileno()
        try:
            if not hasattr(os, "preadv"):  # Windows: one read
                self.f.seek(offset + a)
                if self.f.readinto(view[a:b]) != b - a:
                    raise self.error("the file changed size while being read")
                return
            run_on_threads([lambda a=a, b=b: read(a, b) for a, b in
                            ((o, min(b, o + step)) for o in range(a, b, step))])
        except OSError as exc:
            raise self.error(exc.strerror or str(exc)) from None


class OnThread:
    """A call on a thread of its own; wait() returns its result or raises its error. Waits go by
    an event the call sets when it ends: on Python 3.10-3.12 a KeyboardInterrupt that breaks a
    Thread.join() marks the thread stopped while it runs on, and every later join() returns at
    once (a failed load would then leave it reading or writing behind it)."""

    def __init__(self, fn, name: str = "meganeura-read"):
        self._result, self._error = None, None
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True, name=name)
        self._thread.start()

    def _run(self, fn):
        try:
            self._result = fn()
        except BaseException as exc:  # noqa: BLE001  (raised in the thread that waits)
            self._error = exc
        finally:
            self._ended.set()

    def done(self) -> bool:
        return self._ended.is_set()

    def join(self) -> None:
        """Wait for it, whatever it returns or raises."""
        self._ended.wait()
        self._thread.join()  # (its last instructions: at once)

    def wait(self, timeout: float | None = None):
        if not self._ended.wait(timeout):
            raise TimeoutError(f"still running after {timeout} s")
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result


class Stoppable(OnThread):
    """fn(stop) on a thread of its own, `stop` an Event of its own that stop() sets (then waits):
    a stopped one leaves others of the same work alone."""

    def __init__(self, fn, name: str = "meganeura-read"):
        self.stopping = threading.Event()
        super().__init__(lambda: fn(self.stopping), name)

    def stop(self) -> None:
        self.stopping.set()
        self.join()

    def wait_unless(self, stop) -> bool:
        """wait(), True; or stop(), False, if `stop` (an Event) is set first."""
        while not self._ended.wait(0.01):
            if stop.is_set():
                self.stop()
                return False
        self.wait()
        return True


def again(error: BaseException, what: str) -> BaseException:
    """A copy of a thread's `error` to raise in each caller that asks (raising the one object
    again and again would grow its traceback), caused by it."""
    try:
        copied = copy.copy(error)
    except Exception:  # noqa: BLE001  (an error type that cannot be copied)
        copied = RuntimeError(f"{what}: {error}")
    copied.__cause__, copied.__suppress_context__ = error, True
    return copied


def run_on_threads(tasks, threads: int | None = None):
    """Run callables on `threads` threads (the caller's included; default: the cores, at
    most 8) and re-raise the first error; a thread stops at its own. Their work must release
    the GIL to gain (zlib, os.preadv, memmove, madvise do). The compiler uses it too."""
    it, lock, errors = iter(tasks), threading.Lock(), []

    def work():
        while True:
            with lock:
                task = next(it, None)
            if task is None:
                return
            try:
                task()
            except BaseException as exc:  # noqa: BLE001  (handed to the caller below)
                errors.append(exc)
                return
    n = threads if threads is not None else min(8, os.cpu_count() or 1)
    helpers = [threading.Thread(target=work, daemon=True) for _ in range(max(0, min(n, len(tasks)) - 1))]
    for t in helpers:
        t.start()
    work()
    for t in helpers:
        t.join()
    if errors:
        raise errors[0]


def in_background(calls: dict, threads: int, name: str = "meganeura-load"):
    """Start key -> (fn, *args) calls on up to `threads` threads (0: on the caller's, when
    asked), in the dict's order; returns finish(quiet=False) -> key -> result, which waits for
    them and raises the error of the first call (in that order) that failed (the calls not
    started when one fails are skipped); quiet: cancels
    what has not started and returns nothing. Drivers compile pipelines on the calling thread
    and allow several at once, so a load's compiles go on threads. `name`: its threads' names' prefix."""
    workers = min(threads, os.cpu_count() or 1, len(calls))
    if workers <= 0:
        return lambda quiet=False: {} if quiet else {key: fn(*args) for key, (fn, *args) in calls.items()}
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(workers, thread_name_prefix=name)
    failed = threading.Event()  # once a call fails, those not started yet are skipped at once (not when
    # the caller's thread gets to finish): finish raises that error, and calls start in order, so no
    # skipped call comes before it

    def run(fn, args):
        if failed.is_set():
            return None
        try:
            return fn(*args)
        except BaseException:
            failed.set()
            raise
    futures = {key: pool.submit(run, fn, args) for key, (fn, *args) in calls.items()}

    def finish(quiet=False):
        if quiet:
            pool.shutdown(wait=True, cancel_futures=True)
            return {}
        try:  # in order; at the first error (or an interrupt) what has not started is cancelled
            out = {key: f.result() for key, f in futures.items()}
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return out
    return finish

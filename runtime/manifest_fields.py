"""Checks of one manifest field each (Package's validation): the value's type and range, or a
PackageError naming the field."""
from __future__ import annotations

import gc
from contextlib import contextmanager

from .errors import PackageError


def fail(msg):
    raise PackageError(msg)


def check_int(v, where, lo=0, hi=1 << 40):
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        fail(f"{where}: expected an integer in [{lo}, {hi}], got {v!r:.80}")
    return v


def check_ints(values, where, lo=0, hi=1 << 40) -> None:
    """Each of `values` an integer in [lo, hi]: check_int's check, its message made only for a
    value that fails (a big model's manifest holds ~100,000 of them)."""
    for v in values:
        if type(v) is not int or v < lo or v > hi:  # (an int subclass in range passes check_int too)
            check_int(v, where, lo, hi)


def check_str(v, where, max_len=1 << 20):
    if not isinstance(v, str) or len(v) > max_len:
        fail(f"{where}: expected a string, got {type(v).__name__}")
    return v


def check_list(v, where, max_len=1 << 20):
    if not isinstance(v, list) or len(v) > max_len:
        fail(f"{where}: expected a list, got {type(v).__name__}")
    return v


def check_dict(v, where):
    if not isinstance(v, dict):
        fail(f"{where}: expected a map, got {type(v).__name__}")
    return v


def field(d, k, where):
    if k not in d:
        fail(f"{where}: missing field {k!r}")
    return d[k]


@contextmanager
def no_collection():
    """The cycle collector paused: objects it would free mid-parse run their destructors in the
    parser's stack, and at a hostile depth those fail (RecursionError, unraisable)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()

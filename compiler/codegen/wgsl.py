"""WGSL templates: .wgsl files beside this module with {{NAME}} holes, filled by name."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

_DIR = Path(__file__).parent / "templates"
_HOLE = re.compile(r"\{\{([A-Z0-9_]+)\}\}")


@lru_cache(maxsize=None)
def template(name: str) -> str:
    return (_DIR / f"{name}.wgsl").read_text()


@lru_cache(maxsize=None)
def _pieces(name: str) -> tuple:
    """The template split at its holes: text, hole, text, ... (split once, not per render: a
    large compile renders thousands of times, and a regex callback per hole adds up)."""
    parts = _HOLE.split(template(name))
    return tuple(parts), frozenset(parts[1::2])


def render(name: str, **values) -> str:
    return _filled(*_pieces(name), f"template {name}.wgsl", values)


def fill(text: str, **values) -> str:
    """Any template text (one not beside this module: bench/kernels/) with its holes filled."""
    parts = _HOLE.split(text)
    return _filled(tuple(parts), frozenset(parts[1::2]), "the template", values)


def _filled(parts: tuple, holes: frozenset, what: str, values: dict) -> str:
    if not values.keys() >= holes:
        raise KeyError(f"{what} needs {sorted(holes - set(values))}")
    out = list(parts)
    out[1::2] = [str(values[p]) for p in parts[1::2]]
    return "".join(out)


def i32_literal(v: int) -> str:
    """A WGSL i32 literal, typed (`-3i`): where a size or offset enters i32 arithmetic, the quick
    tier may read it from a uniform (codegen/lift_sizes.py), which an untyped one would not allow."""
    v = int(v)
    return f"{v}i" if v > -(1 << 31) else f"i32({v})"  # (-2147483648i itself is out of range: its digits are)


def f32_literal(v: float) -> str:
    """A WGSL f32 literal for any finite or infinite value."""
    v = float(v)
    if v != v:
        return "bitcast<f32>(0x7fc00000u)"
    if v in (float("inf"), float("-inf")):
        return "bitcast<f32>(0x7f800000u)" if v > 0 else "bitcast<f32>(0xff800000u)"
    text = repr(v)
    if "e" not in text and "." not in text:
        text += ".0"
    return f"f32({text})"

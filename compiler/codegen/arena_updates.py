"""One kernel per parameter group's update: the optimizer's per-parameter update kernels
(the same WGSL but for their length, every binding at the parameter's offset in its
arena, passes/arenas.py) become one kernel over the whole group."""
from __future__ import annotations

import re

from .common import KernelCode, grid

def merge_updates(codes: list, placement: dict, spans: dict, offsets_of: dict, is_scalar, wg: int) -> list:
    """`codes` with each group's per-parameter update kernels (the same WGSL but for their
    length; every binding placed at the parameter's offset, or one element) replaced by one
    kernel over the whole group, where the last of them ran: when each parameter planned in
    the group has exactly one such kernel (the widened one runs over all of its elements)."""
    groups = {}
    for j, code in enumerate(codes):
        sig = _update_signature(code, placement, is_scalar)
        if sig is not None:
            groups.setdefault(sig, []).append(j)
    drop, put = set(), {}
    for (wgsl, bindings, arena), members in groups.items():
        offsets = [_param_offset(codes[j], placement) for j in members]
        if len(members) < 2 or len(set(offsets)) != len(offsets) or set(offsets) != offsets_of.get(arena):
            continue
        lo, hi = members[0], members[-1]
        mine = set(members)
        wrote = {_where(s, placement) for j in members for s, a in codes[j].bindings if a == "read_write"}
        read = {_where(s, placement) for j in members for s, a in codes[j].bindings if a == "read"}
        if any(j not in mine and any(_where(s, placement) in wrote or (a == "read_write" and _where(s, placement) in read)
                                     for s, a in codes[j].bindings) for j in range(lo, hi)):
            continue  # something between them touches what they update
        span = spans[arena]
        put[hi] = KernelCode(wgsl.replace(_TOTAL, f"idx >= {span}u)", 1), codes[lo].workgroup_size,
                             list(bindings), grid(-(-span // wg)), f"{codes[lo].label} x{len(members)}")
        drop |= mine
    return [put.get(j, c) for j, c in enumerate(codes) if j not in drop or j in put]


_TOTAL = "idx >= TOTAL)"


def _param_offset(code, placement) -> int:
    return next(placement[s][1] for s, _ in code.bindings if s in placement and placement[s][0][0] == "param")


def _where(s, placement):
    return placement[s][0] if s in placement else s


def _update_signature(code, placement, is_scalar):
    """(WGSL with its length taken out, bindings as arenas, the group's parameter arena) of
    an elementwise kernel updating one placed parameter; None for any other kernel."""
    placed = [placement[s] for s, _ in code.bindings if s in placement]
    params = [(arena, off) for arena, off in placed if arena[0] == "param"]
    if len(params) != 1 or code.temps or code.variants or code.wgsl.count("idx >= ") != 1:
        return None
    (arena, off), = params
    if any(o != off or a[1] != arena[1] for a, o in placed) or \
            any(s not in placement and not is_scalar(s) for s, _ in code.bindings):
        return None
    # coordinates (per the parameter's shape) may be computed, for scalars read at [0u], but
    # not used: every tensor is read element for element
    lines = [line for line in code.wgsl.split("\n") if not _COORD.match(line)]
    wgsl = "\n".join(lines)
    if _COORD_USE.search(wgsl):
        return None
    start = wgsl.find("idx >= ")
    wgsl = wgsl[:start] + _TOTAL + wgsl[wgsl.find(")", start) + 1:]
    return wgsl, tuple((_where(s, placement), a) for s, a in code.bindings), arena


_COORD = re.compile(r"\s*let c\d+_\d+ = ")


_COORD_USE = re.compile(r"\bc\d+_\d+\b")

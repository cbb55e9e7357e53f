"""Parameter groups: which trainable parameters share an arena (passes/arenas.py lays them
out). Decided as the training graph is built: a group's gradients are counted and its
parameters updated together."""
from __future__ import annotations

from ...runtime.package import OFFSET_ALIGN
from ..options import CompileOptions

ALIGN = OFFSET_ALIGN // 4  # elements: the runtime's offset alignment, 256 bytes
ARENA_BYTES = 128 << 20  # most bytes per group, unless one parameter alone is larger


def padded(elements: int) -> int:
    """Elements a tensor takes in its arena: up to the next 256-byte boundary."""
    return -(-elements // ALIGN) * ALIGN


def layout(sizes: dict, options: CompileOptions) -> tuple:
    """Groups of parameter names (in the order given): about options.arena_groups of them,
    within [options.arena_min_bytes, ARENA_BYTES] bytes unless one parameter alone is larger.
    A group's gradients take their arena from the first one's kernel to the update, so a
    group's size is also what training holds beyond the gradients themselves. Parameters of
    one element stay out: an update kernel reads a one-element parameter and a scalar alike."""
    sizes = {n: size for n, size in sizes.items() if size > 1} if options.arenas else {}
    total = sum(padded(size) * 4 for size in sizes.values())
    limit = min(ARENA_BYTES, max(options.arena_min_bytes, -(-total // options.arena_groups)))
    groups, cur, used = [], [], 0
    for name, size in sizes.items():
        need = padded(size) * 4
        if cur and used + need > limit:
            groups.append(tuple(cur))
            cur, used = [], 0
        cur.append(name)
        used += need
    if cur:
        groups.append(tuple(cur))
    return tuple(groups)

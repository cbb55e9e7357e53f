"""The sizes lifted out of a package's kernels (compiler/codegen/lift_sizes.py): one kernel serves
dispatches of several sizes, each dispatch reading its own from a slice of one uniform buffer."""
from __future__ import annotations

import numpy as np


def slice_bytes(count: int) -> int:
    """Bytes of a kernel's `mn_sizes` (array<vec4<u32>, ceil(count / 4)>)."""
    return 16 * -(-count // 4)


def layout(values: set, align: int) -> tuple:
    """(bytes of the buffer, {values tuple: byte offset}): one slice per tuple, at `align`."""
    values = sorted(v for v in values if v)
    if not values:
        return 0, {}
    step = max(-(-slice_bytes(max(map(len, values))) // align) * align, align)
    return step * len(values), {v: i * step for i, v in enumerate(values)}


def sizes_buffer(device, laid_out: tuple):
    """(uniform buffer, {values tuple: byte offset}) holding the values `layout` placed;
    (None, {}) when no dispatch has any."""
    nbytes, offsets = laid_out
    if not nbytes:
        return None, {}
    import wgpu

    data = np.zeros(nbytes // 4, np.uint32)
    for v, at in offsets.items():
        data[at // 4:at // 4 + len(v)] = v
    buf = device.create_buffer(size=nbytes, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST,
                               label="mn_sizes")
    device.queue.write_buffer(buf, 0, data)
    return buf, offsets


def alignment(device) -> int:
    return device.limits.get("min-uniform-buffer-offset-alignment", 256)

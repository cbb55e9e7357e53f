"""The sizes lifted out of a package's kernels (compiler/lift_sizes.py): one kernel serves
dispatches of several sizes, each dispatch reading its own from a slice of one uniform buffer."""
from __future__ import annotations

import numpy as np


def slice_bytes(count: int) -> int:
    """Bytes of a kernel's `mn_sizes` (array<vec4<u32>, ceil(count / 4)>)."""
    return 16 * -(-count // 4)


def sizes_buffer(device, values: set):
    """(uniform buffer, {values tuple: byte offset}) holding every dispatch's lifted values at
    the device's uniform offset alignment; (None, {}) when no dispatch has any."""
    values = sorted(v for v in values if v)
    if not values:
        return None, {}
    import wgpu

    align = device.limits.get("min-uniform-buffer-offset-alignment", 256)
    step = max(-(-slice_bytes(max(map(len, values))) // align) * align, align)
    data = np.zeros(len(values) * step // 4, np.uint32)
    offsets = {}
    for i, v in enumerate(values):
        data[i * step // 4:i * step // 4 + len(v)] = v
        offsets[v] = i * step
    buf = device.create_buffer(size=data.nbytes, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST,
                               label="mn_sizes")
    device.queue.write_buffer(buf, 0, data)
    return buf, offsets

"""Reading results back without stalling a frame: a ring of mappable staging buffers.

Each frame the host records a copy into a free slot (or skips, when every slot is
still in flight: it never waits), submits, then calls `submitted()`; wgpu maps the
slot in the background and `poll()` hands out the newest finished result, frames later.

    rb = session.readback("infer", "logits")
    ...
    session.record(encoder, "infer"); rb.record(encoder)
    device.queue.submit([encoder.finish()]); rb.submitted()
    got = rb.poll()          # None, or (frame number, ndarray)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FREE, COPIED, MAPPING = "free", "copied", "mapping"


@dataclass
class Slot:
    """One mappable staging buffer of the ring, and where it stands."""

    buffer: object
    state: str = FREE
    frame: int = -1  # the frame whose copy it holds
    promise: object = None  # its map_async's, while MAPPING


class Readback:
    def __init__(self, session, program: str, output: str, depth: int = 3):
        import wgpu

        p = session.package.parsed.programs.get(program)
        if p is None or output not in p.outputs:
            raise KeyError(f"program {program!r} has no output {output!r}")
        self.tensor = t = p.outputs[output]
        self.source, self.offset = session.buffers[t.buffer], t.offset
        self.count = t.count
        self.nbytes = max(4, self.count * 4)
        self.dtype = np.int32 if t.dtype == "i32" else np.float32
        size = -(-self.nbytes // 8) * 8
        self._wgpu = wgpu
        self.slots = [Slot(session.device.create_buffer(size=size, usage=wgpu.BufferUsage.MAP_READ
                                                        | wgpu.BufferUsage.COPY_DST, label=f"readback {output}"))
                      for _ in range(depth)]
        self.frame = 0
        self.skipped = 0  # frames whose copy was skipped because every slot was busy

    @property
    def pending(self) -> int:
        return sum(s.state != FREE for s in self.slots)

    def record(self, encoder) -> bool:
        """Copy the output into a free slot; False (and no copy) when none is free."""
        self.frame += 1
        for s in self.slots:
            if s.state == FREE:
                encoder.copy_buffer_to_buffer(self.source, self.offset, s.buffer, 0, -(-self.nbytes // 4) * 4)
                s.state, s.frame = COPIED, self.frame
                return True
        self.skipped += 1
        return False

    def submitted(self) -> None:
        """Call after submitting the encoder that `record` wrote into."""
        for s in self.slots:
            if s.state == COPIED:
                s.promise = s.buffer.map_async(self._wgpu.MapMode.READ)
                s.state = MAPPING

    def poll(self):
        """The newest finished result as (frame, ndarray), or None; never waits."""
        best = None
        for s in self.slots:
            if s.state == MAPPING and settled(s.promise):
                s.promise.sync_wait()  # already settled: returns at once, marks the buffer mapped
                data = np.frombuffer(s.buffer.read_mapped(0, s.buffer.size, copy=True), self.dtype)
                s.buffer.unmap()
                s.state, s.promise = FREE, None
                value = data[: self.count].reshape(self.tensor.shape).copy()
                if best is None or s.frame > best[0]:
                    best = (s.frame, value)
        return best


def settled(promise) -> bool:
    """Has wgpu's poll thread completed this promise? (wgpu-py 0.32 exposes no public flag;
    its map state only changes once the promise is resolved on our thread.)"""
    event = getattr(promise, "_thread_event", None)
    if event is not None:
        return event.is_set()
    return getattr(promise, "_state", "pending") != "pending"

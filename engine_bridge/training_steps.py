"""The buffers a training step spread over frames keeps to itself (FrameScheduler's training).

A step's batch goes into a private ring of held buffers (queue.write_buffer, once per step), or,
when the data is already on the GPU, is snapshotted there as the step starts. Every buffer the
step shares with another program (an input that inference also reads, features that inference
caches for it) is swapped around each training chunk that binds it, with GPU copies: the other
program's value saved, the step's put in, the chunk run, the step's kept, the other's put back.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Kept:
    """A buffer the step keeps to itself: the declared input it holds (or None), its bytes, whether
    another program writes it (or takes it as input) between the step's chunks, and then where the
    other program's value waits while a chunk runs."""

    name: str | None
    nbytes: int
    shared: bool
    save: object = None


@dataclass
class HeldBatch:
    """One slot of the ring: the step's own copy of each kept buffer, free once frame `free_after` is over."""

    buffers: dict
    free_after: float = -1


@dataclass
class Step:
    """A step under way: its slot of the ring, its number, its next chunk, whether its batch was uploaded."""

    slot: int
    index: int
    frame: int
    uploaded: bool
    next: int = 0


class StepBuffers:
    """Kept buffers and a ring of `count` held batches for `program` of `session`, cut into `chunks`
    ([(index, first dispatch, end)]); made by set_up() once the session's training state exists."""

    def __init__(self, session, program: str, chunks: list, count: int):
        self.session, self.device, self.program, self.chunks = session, session.device, program, chunks
        self.count = count
        self.program_info = session.package.parsed.programs[program]
        self.inputs = dict(self.program_info.inputs)  # name -> TensorInfo
        self.kept, self.held, self.touches = {}, [], []

    @property
    def ready(self) -> bool:
        return bool(self.held)

    def set_up(self) -> None:
        """Find the buffers a step must keep to itself: its declared inputs, and every buffer it
        binds that another program writes (or takes as input) between its chunks."""
        import wgpu

        s, m, prog = self.session, self.session.package.parsed, self.program_info
        usage = wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        others = set()
        for name, q in m.programs.items():
            if name != self.program:
                for d in q.dispatches:
                    access = m.kernels[d.kernel].access
                    others |= {b.buffer for b, a in zip(d.bindings, access) if a == "read_write"}
                others |= {t.buffer for t in q.inputs.values()}
        bound = {b.buffer for d in prog.dispatches for b in d.bindings}
        declared = {t.buffer: name for name, t in self.inputs.items()}
        for b in sorted((bound & others) | set(declared)):
            t = self.inputs.get(declared.get(b))
            nbytes = max(4, t.count * 4) if t else s.buffers[b].size
            self.kept[b] = Kept(declared.get(b), nbytes, b in others,
                                self.device.create_buffer(size=nbytes, usage=usage) if b in others else None)
        self.held = [HeldBatch({b: self.device.create_buffer(size=k.nbytes, usage=usage, label=f"held {b}")
                                for b, k in self.kept.items()}) for _ in range(self.count)]
        self.touches = [{b.buffer for d in prog.dispatches[a:e] for b in d.bindings} for _, a, e in self.chunks]

    def count_every_row(self) -> None:
        """Data already on the GPU: every row of a batch counts (the row mask's one upload)."""
        mask = self.program_info.row_mask
        if mask:
            t = self.inputs[mask]
            self.device.queue.write_buffer(self.session.buffers[t.buffer], 0, np.ones(t.shape, np.float32))

    def free_slot(self, frame: int) -> int | None:
        """A held slot that may be rewritten: its step's last chunk went out in an earlier frame
        (queue.write_buffer runs before this frame's commands)."""
        return next((k for k, h in enumerate(self.held) if h.free_after < frame), None)

    def upload(self, slot: int, batch: dict) -> None:
        for name, arr in self.coerce(batch).items():
            self.device.queue.write_buffer(self.held[slot].buffers[self.inputs[name].buffer], 0, arr.tobytes())

    def record_chunk(self, encoder, step: Step, i: int, run) -> None:
        """Chunk `i` of `step`, recorded by run(encoder), with the step's buffers swapped in around it
        (save theirs, put the step's, run, keep the step's, put theirs back)."""
        s, held, first = self.session, self.held[step.slot].buffers, step.next == 0
        swap = []
        for bi, k in self.kept.items():
            buf, mine, n = s.buffers[bi], held[bi], k.nbytes
            if first and (k.name is None or not step.uploaded):
                if k.shared:
                    encoder.copy_buffer_to_buffer(buf, 0, mine, 0, n)  # the step's snapshot of the GPU's data
            elif first and not k.shared:
                encoder.copy_buffer_to_buffer(mine, 0, buf, 0, n)  # the uploaded batch, once
            if k.shared and bi in self.touches[i]:
                encoder.copy_buffer_to_buffer(buf, 0, k.save, 0, n)
                encoder.copy_buffer_to_buffer(mine, 0, buf, 0, n)
                swap.append((buf, mine, k.save, n))
        run(encoder)
        for buf, mine, theirs, n in swap:
            encoder.copy_buffer_to_buffer(buf, 0, mine, 0, n)
            encoder.copy_buffer_to_buffer(theirs, 0, buf, 0, n)

    def coerce(self, batch) -> dict:
        """A batch as the step's inputs hold it: shapes checked, a partial batch padded and masked."""
        mask = self.program_info.row_mask
        public = self.program_info.public_inputs
        if set(batch) != set(public):
            raise ValueError(f"{self.program}: a batch needs exactly the inputs {sorted(public)}; got {sorted(batch)}")
        out, rows = {}, set()
        for name in public:
            t = self.inputs[name]
            shape, arr = list(t.shape), np.asarray(batch[name])
            if list(arr.shape) != shape:
                partial = (mask and arr.ndim == len(shape) and list(arr.shape[1:]) == shape[1:]
                           and 0 < arr.shape[0] < shape[0])
                if not partial:
                    raise ValueError(f"input {name!r} has shape {list(arr.shape)}; the model expects {shape}")
                rows.add(arr.shape[0])
                arr = np.concatenate([arr, np.zeros([shape[0] - arr.shape[0]] + shape[1:], arr.dtype)])
            elif mask:
                rows.add(shape[0])
            if t.dtype == "i32" and arr.dtype.kind not in "iub":
                raise TypeError(f"input {name!r} holds {arr.dtype} values; it takes integers")
            out[name] = np.ascontiguousarray(arr, np.int32 if t.dtype == "i32" else np.float32)
        if mask:
            if len(rows) != 1:
                raise ValueError(f"the inputs of one batch have different row counts: {sorted(rows)}")
            n = self.inputs[mask].shape[0]
            out[mask] = (np.arange(n) < rows.pop()).astype(np.float32)
        return out

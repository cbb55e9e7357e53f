"""A Session's GPU objects and their making: buffers, bind group layouts, pipelines, bind groups,
and the writes into the buffers. The loader, the training state and the tuned tier make theirs here;
wgpu's errors become the runtime's (DeviceLostError, GPUOutOfMemoryError, PackageError)."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from . import native
from .errors import DeviceLostError, GPUOutOfMemoryError, PackageError
from .lifted_sizes import slice_bytes
from .records import BindGroupKey, BufferPlan, KernelInfo, TensorInfo


class GpuObjects:
    """What one Session made on `device` from `plan`: `buffers` (index -> GPUBuffer; a
    training_state.Buffers once the load has made them), the lifted sizes' uniform buffer and its
    slices (`sizes`), and `allocated_bytes`. `progress` (a background load's, or None) counts each
    pipeline and weight write."""

    def __init__(self, device, plan: BufferPlan, shader_checks: bool, progress=None):
        import wgpu

        self.device, self.plan, self.shader_checks, self.progress = device, plan, shader_checks, progress
        self.wgpu = wgpu
        self.buffers = {}
        self.sizes = (None, {})  # (uniform buffer, {lifted values: byte offset}): runtime/lifted_sizes.py
        self.allocated_bytes = 0
        self.lost = self.closed = False
        self._layouts = {}  # LayoutKey -> (bind group layout, pipeline layout)

    @contextmanager
    def guard(self, what: str):
        """Turn wgpu's "device is lost" validation errors into DeviceLostError, and its out of
        memory into GPUOutOfMemoryError; RuntimeError once the Session is closed."""
        if self.closed:
            raise RuntimeError(f"{what}: this session was closed")
        if self.lost:
            raise DeviceLostError(f"{what}: the GPU device was lost; make a new session with session.rebuild()")
        try:
            yield
        except self.wgpu.GPUValidationError as exc:
            self.raise_if_lost(exc, what)
            raise
        except self.wgpu.GPUOutOfMemoryError as exc:
            raise GPUOutOfMemoryError(f"{what}: the GPU ran out of memory ({str(exc).strip()[:200]})") from None

    def raise_if_lost(self, exc, what: str) -> None:
        if "device is lost" in str(exc) or "Device lost" in str(exc):
            self.lost = True
            raise DeviceLostError(f"{what}: the GPU device was lost (driver reset, GPU removed or device "
                                  "destroyed); make a new session with session.rebuild()") from None

    def allocate(self, which: list, what: str, cancel=None, before=()) -> dict:
        """Buffers `which` (indices into the plan's sizes), index -> buffer; none once `cancel` is set.
        (`before`: those made before them, counted in the out-of-memory message.)"""
        wgpu, sizes = self.wgpu, self.plan.buffers
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        made, total = {}, 0
        for i in which:
            if cancel is not None and cancel.is_set():
                return {}
            try:
                made[i] = self.device.create_buffer(size=sizes[i], usage=usage, label=f"mn{i}")
            except wgpu.GPUValidationError as exc:
                made.clear()  # released, not destroyed: nothing was ever submitted with them
                self.raise_if_lost(exc, f"making {what}")
                raise GPUOutOfMemoryError(
                    f"{what} needs {sum(sizes[j] for j in (*before, *which)) / 2**20:.1f} MiB of GPU memory in "
                    f"{len(before) + len(which)} buffers; the device could not allocate buffer {i} "
                    f"({sizes[i] / 2**20:.1f} MiB): {str(exc).strip().splitlines()[-1].strip()}") from None
            total += sizes[i]
        self.allocated_bytes += total  # (all of them, or none)
        return made

    def let_go(self, made: dict) -> None:
        """Buffers of `made` (allocated here) no longer held: nothing ran with them."""
        self.allocated_bytes -= sum(b.size for b in made.values())

    def layout(self, kernel: KernelInfo) -> tuple:
        """(bind group layout, pipeline layout) of `kernel`: one for every kernel that binds alike."""
        wgpu, key = self.wgpu, kernel.layout
        if key not in self._layouts:
            entries = [{"binding": b, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": "storage" if a == "read_write" else "read-only-storage"}}
                       for b, a in enumerate(key.access)]
            if key.lifted:  # (its size: a kernel declaring more than its count is refused when its pipeline is made)
                entries.append({"binding": len(entries), "visibility": wgpu.ShaderStage.COMPUTE,
                                "buffer": {"type": "uniform", "min_binding_size": slice_bytes(key.lifted)}})
            try:
                bgl = self.device.create_bind_group_layout(entries=entries)
                self._layouts[key] = (bgl, self.device.create_pipeline_layout(bind_group_layouts=[bgl]))
            except wgpu.GPUValidationError as exc:
                self.raise_if_lost(exc, "loading the package")
                raise
        return self._layouts[key]

    def pipeline(self, i: int, kernel: KernelInfo, counted: bool = True) -> tuple:
        """(compute pipeline, bind group layout) of kernel `i`: the driver compiles it here, on the
        calling thread (`counted`: a tick of the load's progress)."""
        wgpu = self.wgpu
        bgl, layout = self.layout(kernel)
        try:
            module = native.shader_module(self.device, kernel.wgsl, kernel.label, bool(self.shader_checks))
            pipeline = self.device.create_compute_pipeline(
                layout=layout, compute={"module": module, "entry_point": kernel.entry}, label=kernel.label)
        except wgpu.GPUValidationError as exc:
            self.raise_if_lost(exc, "loading the package")
            raise PackageError(f"kernel {i} ({kernel.label}) was rejected by the WGSL compiler: {exc}") from None
        if counted and self.progress is not None:
            self.progress.tick()
        return pipeline, bgl

    def bind_group(self, program: str, j: int, key: BindGroupKey):
        """The bind group of `key`, made for dispatch `j` of `program` (named in its error)."""
        buffers = self.buffers
        entries = [(buffers[b.buffer], b.offset, b.size if b.size is not None else buffers[b.buffer].size)
                   for b in key.bindings]
        if key.lifted:  # the kernel's sizes, after its storage buffers (compiler/codegen/lift_sizes.py)
            entries.append((self.sizes[0], self.sizes[1][key.lifted], slice_bytes(len(key.lifted))))
        try:
            return native.bind_group(self.device, self._layouts[key.layout][0], entries)
        except self.wgpu.GPUValidationError as exc:
            self.raise_if_lost(exc, "loading the package")
            raise PackageError(f"program {program} dispatch {j}: {exc}") from None

    def write(self, t: TensorInfo, value, into=None) -> None:
        """`value` into tensor `t`'s place in its buffer (of `into`, index -> buffer, when given)."""
        arr = np.ascontiguousarray(value, dtype=t.np_dtype)
        if arr.nbytes % 4:  # an odd number of f16 values: writes come in whole 4-byte words
            arr = np.concatenate([arr.reshape(-1), np.zeros(1, arr.dtype)])
        if arr.nbytes:  # straight from the array: wgpu copies it into its staging memory
            buffers = self.buffers if into is None else into
            self.device.queue.write_buffer(buffers[t.buffer], t.offset, arr)

    def read(self, t: TensorInfo) -> np.ndarray:
        """Tensor `t`'s values, of which it holds some (blocking: it waits for the GPU)."""
        data = self.device.queue.read_buffer(self.buffers[t.buffer], t.offset, -(-t.nbytes // 4) * 4)
        return np.frombuffer(data, dtype=t.np_dtype)[:t.count].reshape(t.shape).copy()

    def release(self) -> None:
        """Let go of every object (released, never destroyed: wgpu frees each once no submitted
        command buffer uses it)."""
        self.closed = True
        self.buffers, self._layouts, self.sizes = [], {}, (None, {})

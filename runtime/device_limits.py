"""A package's needs against a device's features and limits, checked before anything is allocated."""
from __future__ import annotations

from .errors import GPUOutOfMemoryError, PackageError
from .lifted_sizes import alignment, layout
from .records import BufferPlan, Manifest

_LIMIT_NAMES = {  # manifest name -> wgpu limit name
    "max_storage_buffers_per_shader_stage": "max-storage-buffers-per-shader-stage",
    "max_compute_workgroups_per_dimension": "max-compute-workgroups-per-dimension",
    "max_storage_buffer_binding_size": "max-storage-buffer-binding-size",
    "max_buffer_size": "max-buffer-size",
}


def check_device(m: Manifest, device, memory_limit: int | None) -> tuple:
    """After check_buffers, what the kernels and dispatches ask for (a hostile package may
    declare less than it uses) against `device`'s limits, and the lifted sizes' uniform buffer
    against them and `memory_limit` (bytes); returns that buffer's layout (runtime/lifted_sizes.py)."""
    limits = device.limits
    # the lifted sizes' uniform buffer: every dispatch's (and variant's) values, laid out once
    sizes_layout = layout(m.lifted_values(), alignment(device))
    sizes_bytes = sizes_layout[0]
    if sizes_bytes > limits.get("max-buffer-size", 1 << 62):
        raise PackageError(f"the package's lifted sizes need a {sizes_bytes}-byte buffer; this device's "
                           f"largest is {limits.get('max-buffer-size')} bytes")
    _fits(sum(m.buffers) + sizes_bytes, memory_limit)
    bindings = limits.get("max-storage-buffers-per-shader-stage", 8)
    invocations = limits.get("max-compute-invocations-per-workgroup", 256)
    sizes = [limits.get(f"max-compute-workgroup-size-{a}", 1 << 16) for a in "xyz"]
    for i, k in enumerate(m.kernels):
        if len(k.access) > bindings:
            raise PackageError(f"kernel {i} binds {len(k.access)} storage buffers; this device allows {bindings}")
        ws = k.workgroup_size
        if ws[0] * ws[1] * ws[2] > invocations or any(w > n for w, n in zip(ws, sizes)):
            raise PackageError(f"kernel {i}: workgroup size {list(ws)} exceeds this device's limits "
                               f"({invocations} invocations, {sizes})")
    most = limits.get("max-compute-workgroups-per-dimension", 65535)
    for name, p in m.programs.items():
        for j, d in enumerate(p.dispatches):
            for launch in (d.launch, *d.variants.values()):
                if max(launch.workgroups) > most:
                    raise PackageError(f"program {name} dispatch {j}: {list(launch.workgroups)} workgroups; "
                                       f"this device allows {most} per dimension")
    return sizes_layout


def check_buffers(plan: BufferPlan, device, memory_limit: int | None) -> None:
    """What making the buffers asks of `device` and `memory_limit`: the package's declared
    features and limits, each buffer's size, their sum (check_device adds the lifted sizes' buffer)."""
    missing = [f for f in plan.features if f not in device.features]
    if missing:
        raise PackageError(f"this device lacks features the package needs: {missing}")
    limits = device.limits
    for name, need in plan.limits.items():
        have = limits.get(_LIMIT_NAMES.get(name, name.replace("_", "-")))
        if have is not None and need > have:
            raise PackageError(f"the package needs {name} = {need}; this device allows {have}")
    biggest = min(limits.get("max-buffer-size", 1 << 62), limits.get("max-storage-buffer-binding-size", 1 << 62))
    for i, size in enumerate(plan.buffers):
        if size > biggest:
            raise PackageError(f"buffer {i} needs {size} bytes; this device's largest storage buffer "
                               f"is {biggest} bytes")
    _fits(sum(plan.buffers), memory_limit)


def _fits(total: int, memory_limit: int | None) -> None:
    if memory_limit is not None and total > memory_limit:
        raise GPUOutOfMemoryError(f"the package needs {total / 2**20:.1f} MiB of GPU memory; "
                                  f"memory_limit allows {memory_limit / 2**20:.1f} MiB")

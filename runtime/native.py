"""Calls into wgpu-native that wgpu-py 0.32 does not offer."""
from __future__ import annotations

import functools

# wgpu-native's WGPUShaderRuntimeChecks flags (wgpu.h)
BOUNDS_CHECKS, LOOP_BOUNDING = 0x1, 0x2


def unchecked_module(device, code: str, label: str, keep: int = 0):
    """A shader module made by wgpu-native's wgpuDeviceCreateShaderModuleTrusted with none of
    wgpu's runtime checks, or only those in `keep` (BOUNDS_CHECKS, LOOP_BOUNDING; wgpu-py 0.32
    has no call for it)."""
    try:
        from wgpu.backends.wgpu_native._api import (
            GPUShaderModule,
            ffi,
            lib,
            libf,
            new_struct_p,
            to_c_string_view,
        )
    except ImportError:  # another wgpu-py layout: checked kernels, said once
        import warnings

        warnings.warn("shader_checks=False needs wgpu-py's wgpu_native backend; kernels keep their checks",
                      stacklevel=2)
        return device.create_shader_module(code=code, label=label)
    source = new_struct_p("WGPUShaderSourceWGSL *", code=to_c_string_view(code))
    source[0].chain.next = ffi.NULL
    source[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
    desc = new_struct_p("WGPUShaderModuleDescriptor *", nextInChain=ffi.cast("WGPUChainedStruct *", source),
                        label=to_c_string_view(label))
    handle = libf.wgpuDeviceCreateShaderModuleTrusted(device._internal, desc, keep)
    if handle == ffi.NULL:
        raise RuntimeError(f"shader module {label!r} was not made")
    return GPUShaderModule(label, handle, device)


def shader_module(device, code: str, label: str = "", checked=True):
    """A shader module with wgpu's runtime checks (True, the default), without them (False,
    unchecked_module), or with some (an int of BOUNDS_CHECKS / LOOP_BOUNDING)."""
    if isinstance(checked, bool):
        return device.create_shader_module(code=code, label=label) if checked else unchecked_module(device, code, label)
    return unchecked_module(device, code, label, checked)


@functools.cache
def _bind_group_calls():
    """(ffi, the error-checked wgpuDeviceCreateBindGroup, new_struct_p, to_c_string_view,
    GPUBindGroup) of wgpu-py's wgpu_native backend, or None."""
    try:
        from wgpu.backends.wgpu_native._api import GPUBindGroup, ffi, libf, new_struct_p, to_c_string_view

        return ffi, libf.wgpuDeviceCreateBindGroup, new_struct_p, to_c_string_view, GPUBindGroup
    except (ImportError, AttributeError):
        return None


def bind_group(device, layout, buffers, label: str = ""):
    """A bind group of `buffers` ([(buffer, offset, size)], binding = index) through the C call
    wgpu-py makes, its errors raised as wgpu-py raises them: a fraction of the Python that
    device.create_bind_group's argument checks cost (a Session makes thousands for a big training
    package, on one thread that holds the GIL)."""
    calls = _bind_group_calls()
    if calls is None:  # another wgpu-py layout: the public call
        return device.create_bind_group(layout=layout, label=label, entries=[
            {"binding": b, "resource": {"buffer": buf, "offset": offset, "size": size}}
            for b, (buf, offset, size) in enumerate(buffers)])
    ffi, create, new_struct_p, string_view, GPUBindGroup = calls
    entries = ffi.new("WGPUBindGroupEntry[]", len(buffers))  # (zeroed: no sampler, no texture view)
    for b, (buf, offset, size) in enumerate(buffers):
        e = entries[b]
        e.binding, e.buffer, e.offset, e.size = b, buf._internal, offset, size
    desc = new_struct_p("WGPUBindGroupDescriptor *", label=string_view(label), layout=layout._internal,
                        entryCount=len(buffers), entries=entries)
    return GPUBindGroup(label, create(device._internal, desc), device)


def raw_calls():
    """wgpu-native's own C entry points for the three per-dispatch calls, or None. Through
    wgpu-py each call costs microseconds of CPU (argument checks, an ffi array per
    set_bind_group, error capture around every call); the C calls cost a fraction of that.
    Skipping the capture loses nothing: wgpu-core stores errors made while encoding a pass and
    reports them at its end(), which still goes through wgpu-py."""
    try:
        from wgpu.backends.wgpu_native._ffi import ffi, lib

        return (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL)
    except (ImportError, AttributeError):  # another wgpu-py layout: the public calls still work
        return None


_UNSET = object()
_RAW_CALLS = _UNSET  # looked up at the first record(): importing the runtime loads no wgpu


def raw():
    """raw_calls(), looked up once."""
    global _RAW_CALLS
    if _RAW_CALLS is _UNSET:
        _RAW_CALLS = raw_calls()
    return _RAW_CALLS


def record_raw(raw, handle, steps):
    """Encode `steps` (Session.programs entries) into the pass `handle` through the C calls."""
    set_pipeline, set_group, dispatch, null = raw
    last = None
    for _, _, (x, y, z), pipeline, group in steps:
        if pipeline != last:
            set_pipeline(handle, pipeline)
            last = pipeline
        set_group(handle, 0, group, 0, null)
        dispatch(handle, x, y, z)

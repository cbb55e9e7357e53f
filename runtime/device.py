"""Which wgpu device the runtime uses. Nothing here runs at import time.

With no device given, the runtime joins wgpu's default device, declaring its wishes
through wgpu.utils.preconfigure_default_device (the convention pygfx uses), so one
process shares one device between every wgpu library in it.
"""
from __future__ import annotations

import os
import weakref

PREFERRED_FEATURES = {"shader-f16", "subgroup", "subgroups", "timestamp-query", "timestamp-query-inside-passes"}


class NoAdapterError(RuntimeError):
    """No GPU adapter (not even a CPU one like lavapipe) is available."""


def default_device():
    """wgpu's shared default device, preferring the features our kernels can use."""
    import wgpu

    os.environ.setdefault("XDG_RUNTIME_DIR", _runtime_dir())
    utils = wgpu.utils
    if getattr(utils, "_meganeura_configured", False) is False and not _default_exists(utils):
        try:
            utils.preconfigure_default_device("meganeura", power_preference="high-performance",
                                              preferred_features=set(PREFERRED_FEATURES))
        except Exception:  # the default device already exists: use it as it is
            pass
        utils._meganeura_configured = True
    try:
        return utils.get_default_device()
    except RuntimeError as exc:
        raise NoAdapterError(
            "no GPU adapter found: install a Vulkan driver (on Debian/Ubuntu: "
            "apt-get install mesa-vulkan-drivers libvulkan1 for a CPU fallback)") from exc


def _default_exists(utils) -> bool:
    helper = getattr(utils.get_default_device, "__self__", None)
    return getattr(helper, "_the_device", None) is not None


def _runtime_dir() -> str:
    path = f"/tmp/meganeura-xdg-{os.getuid()}" if hasattr(os, "getuid") else "."
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def fresh_device():
    """A new device on the best adapter, with the features our kernels can use: what a
    session is rebuilt on after its device was lost (a lost device never returns)."""
    import wgpu

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        raise NoAdapterError("no GPU adapter found to rebuild the session on")
    return adapter.request_device_sync(required_features=[f for f in PREFERRED_FEATURES if f in adapter.features])


# the CPU rasterisers' kernel variants broadcast values within subgroups of this many lanes
CPU_LANES = 8
_LANES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_PROBE = """@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main(@builtin(subgroup_size) lanes: u32) { out[0] = lanes; }"""


def runs_cpu_variants(device) -> bool:
    """Whether `device` can run the CPU rasterisers' kernel variants: it has the subgroup
    feature and 8-lane subgroups (lavapipe on 256-bit SIMD). Measured once per device with a
    one-invocation kernel (a few milliseconds)."""
    if "subgroup" not in device.features:
        return False
    try:
        return _LANES[device] == CPU_LANES
    except KeyError:
        pass
    except TypeError:  # (a device that takes no weak reference is measured each time)
        return _subgroup_size(device) == CPU_LANES
    _LANES[device] = _subgroup_size(device)
    return _LANES[device] == CPU_LANES


def _subgroup_size(device) -> int:
    import numpy as np
    import wgpu

    buf = device.create_buffer(size=16, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    pipeline = device.create_compute_pipeline(
        layout="auto", compute={"module": device.create_shader_module(code=_PROBE), "entry_point": "main"})
    group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                     entries=[{"binding": 0, "resource": {"buffer": buf}}])
    enc = device.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipeline)
    cp.set_bind_group(0, group)
    cp.dispatch_workgroups(1)
    cp.end()
    device.queue.submit([enc.finish()])
    size = int(np.frombuffer(device.queue.read_buffer(buf, size=4), np.uint32)[0])
    buf.destroy()
    return size

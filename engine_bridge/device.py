"""Which device the bridge uses: the host's, or wgpu's shared default device.

The bridge never makes a device of its own. Given a GPUDevice (pygfx's, an engine's)
it uses that; given none, it joins wgpu's default device through the runtime, which
declares its wishes with wgpu.utils.preconfigure_default_device (shader-f16, subgroup,
timestamp-query when the adapter has them), so that every wgpu library in the process
shares one device.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

log = logging.getLogger("meganeura.engine_bridge")
SHADERS = Path(__file__).parent / "shaders"


def shared_device(device=None):
    """`device` itself when given (any wgpu GPUDevice), else wgpu's shared default device."""
    import wgpu

    if device is None:
        from meganeura.runtime.device import default_device

        return default_device()
    if not isinstance(device, wgpu.GPUDevice):
        raise TypeError(f"expected a wgpu.GPUDevice, got {type(device).__name__}")
    return device


def declare_device_wishes() -> bool:
    """Ask wgpu's default device for the features our kernels can use (shader-f16, subgroup,
    timestamp-query), when the adapter has them. Runs at import of meganeura.engine_bridge,
    the convention of pygfx and wgpu (preconfigure_default_device): it creates no device,
    and a library that creates the default device later (pygfx's renderer) gets the union.
    False when the default device exists already: it is then used as it is."""
    try:
        import wgpu.utils
        from meganeura.runtime.device import PREFERRED_FEATURES
    except ImportError:
        return False
    helper = getattr(wgpu.utils.get_default_device, "__self__", None)
    if helper is None or getattr(helper, "_the_device", None) is not None:
        return False
    wgpu.utils.preconfigure_default_device("meganeura.engine_bridge", preferred_features=set(PREFERRED_FEATURES))
    return True


def vulkan_only() -> bool:
    """Restrict wgpu's instance to Vulkan on Linux, before the first adapter request.

    wgpu's GL backend panics beside an SDL window; a window host calls this first.
    Returns False (and changes nothing) elsewhere or once wgpu's instance exists.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import wgpu.backends.wgpu_native._helpers as native_helpers  # (wgpu-py 0.32: the instance, privately)
        from wgpu.backends.wgpu_native.extras import set_instance_extras
    except ImportError:  # another wgpu backend
        return False
    if getattr(native_helpers, "_the_instance", None) is not None:
        log.debug("wgpu's instance already exists: cannot restrict it to Vulkan")
        return False
    set_instance_extras(backends=["Vulkan"])
    return True


def has_timestamps(device) -> bool:
    return "timestamp-query" in device.features


def load_wgsl(name: str) -> str:
    return (SHADERS / name).read_text()

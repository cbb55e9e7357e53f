"""meganeura.engine_bridge: hosts, texture<->tensor kernels and the frame scheduler.

Imports meganeura.runtime only; pygame, glfw and pygfx are imported when a host needs them.
At import it declares (creates nothing) the device features it prefers, as pygfx does.
"""
from .device import declare_device_wishes, has_timestamps, shared_device, vulkan_only
from .hosts import GlfwHost, Host, OffscreenHost, PygameHost, TextureHost, pygfx_texture
from .scene import PatternScene
from .scheduler import FrameScheduler
from .texture_io import (
    DEFAULT_PALETTE,
    Compositor,
    TensorOverlay,
    TextureInput,
    overlay_reference,
    preprocess_reference,
    read_texture,
)

__all__ = ["DEFAULT_PALETTE", "Compositor", "FrameScheduler", "GlfwHost", "Host", "OffscreenHost", "PatternScene",
           "PygameHost", "TensorOverlay", "TextureHost", "TextureInput", "declare_device_wishes", "has_timestamps",
           "overlay_reference", "preprocess_reference", "pygfx_texture", "read_texture", "shared_device",
           "vulkan_only"]

declare_device_wishes()

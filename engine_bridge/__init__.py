"""meganeura.engine_bridge: hosts, texture<->tensor kernels and the frame scheduler.

Imports meganeura.runtime only; pygame, glfw and pygfx are imported when a host needs them.
"""
from .device import has_timestamps, shared_device, vulkan_only  # noqa: F401
from .hosts import GlfwHost, Host, OffscreenHost, PygameHost, TextureHost  # noqa: F401
from .scene import PatternScene  # noqa: F401
from .scheduler import FrameScheduler  # noqa: F401
from .texture_io import (DEFAULT_PALETTE, Compositor, TensorOverlay, TextureInput,  # noqa: F401
                         overlay_reference, preprocess_reference, read_texture)

"""Hosts: where frames go. Each gives `device`, `size`, `format`, `texture()` (this
frame's target), `present()`, `poll()` (events; False once the user closed it), `close()`.

    PygameHost   an SDL window through pygame, a wgpu surface on it (X11 or Windows)
    GlfwHost     a glfw window (wgpu.utils.glfw_present_info)
    OffscreenHost  a texture you render into; no display needed (tests, servers, CI)
    TextureHost  bring your own: an existing device and texture (pygfx, an engine)

Window hosts restrict wgpu to Vulkan on Linux before the first adapter request (wgpu's
GL backend panics beside an SDL window): make the host before any device exists.
"""
from __future__ import annotations

import ctypes
import sys

from .device import shared_device, vulkan_only

_TARGET_USAGE = 0x10 | 0x04 | 0x01  # RENDER_ATTACHMENT | TEXTURE_BINDING | COPY_SRC


class Host:
    """Where frames go: `device`, `size`, `format`, `texture()` (this frame's target),
    `present()`, `poll()` (handles events; False once the user closed it) and `close()`."""

    device = None
    format = "rgba8unorm"
    size = (0, 0)
    running = True
    _closed = False

    def texture(self):
        raise NotImplementedError

    def present(self) -> None:
        pass

    def poll(self) -> bool:
        return self.running

    def close(self) -> None:
        self.running = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class TextureHost(Host):
    """Frames go into `texture` on `device` (both the host's own: pygfx's, an engine's).

    Args:
        device: the host's GPUDevice, or None for wgpu's shared default device.
        texture: the GPUTexture frames are drawn into (pygfx_texture() gives pygfx's).
    """

    def __init__(self, device, texture):
        self.device = shared_device(device)
        self._texture = texture
        self.format, self.size = texture.format, (texture.width, texture.height)

    def texture(self):
        return self._texture


class OffscreenHost(TextureHost):
    """Frames go into a texture of our own: no window, no display (tests, servers, CI).

    Args:
        size: (width, height) in pixels.
        device: a GPUDevice, or None for wgpu's shared default device.
        format: the texture's format.
    """

    def __init__(self, size=(640, 480), device=None, format: str = "rgba8unorm"):
        device = shared_device(device)
        w, h = size
        super().__init__(device, device.create_texture(size=(w, h, 1), format=format, usage=_TARGET_USAGE,
                                                       label="offscreen target"))


class SurfaceHost(Host):
    """A wgpu surface on a native window, given its present_info."""

    def __init__(self, present_info: dict, size, device=None):
        import wgpu

        self.device = shared_device(device)
        self.context = wgpu.gpu.get_canvas_context(present_info)
        self.size = tuple(int(s) for s in size)
        self.context.set_physical_size(*self.size)
        preferred = self.context.get_preferred_format(self.device.adapter)
        try:  # wgpu-py 0.32 lists the surface's formats and usages only privately
            caps = self.context._get_capabilities(self.device.adapter)
        except AttributeError:
            caps = {"formats": [preferred], "usages": wgpu.TextureUsage.RENDER_ATTACHMENT}
        # a non-sRGB format: the bridge's colours and the scene are written as they are
        plain = [f for f in caps["formats"] if not f.endswith("srgb")]
        self.format = plain[0] if plain else preferred
        self.usage = _TARGET_USAGE & caps["usages"] | wgpu.TextureUsage.RENDER_ATTACHMENT
        self._configure()

    def _configure(self):
        self.context.configure(device=self.device, format=self.format, usage=self.usage)

    def resize(self, size) -> None:
        self.size = tuple(int(s) for s in size)
        self.context.set_physical_size(*self.size)

    def texture(self):
        return self.context.get_current_texture()

    def present(self) -> None:
        self.context.present()

    def _release_surface(self) -> None:
        """Free the surface while its window and X display still exist (a surface released
        after them talks to a closed X connection, and Xlib ends the process)."""
        self.device.queue.submit([])
        self.context.unconfigure()
        release = getattr(self.context, "_release", None)  # wgpu-py 0.32 has no public call
        if release is not None:
            release()


def _capsule_pointer(capsule, name: bytes) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return int(get(capsule, name))


def optional(module: str, what: str):
    """Import `module`, an optional dependency, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{what} needs {module.split('.')[0]}, which is not installed: "
                          "pip install 'meganeura[demo]'") from exc


def pygame_present_info(vsync: bool = False) -> dict:
    """The present_info of pygame's current window (after pygame.display.set_mode)."""
    pygame = optional("pygame", "a pygame window")

    info = pygame.display.get_wm_info()
    if sys.platform.startswith("win"):
        return {"platform": "windows", "window": int(info["window"]), "vsync": vsync}
    if sys.platform.startswith("linux") and "display" in info and "window" in info:
        display = info["display"]
        display = display if isinstance(display, int) else _capsule_pointer(display, b"display")
        return {"platform": "x11", "window": int(info["window"]), "display": display, "vsync": vsync}
    raise RuntimeError(f"pygame gives no X11 or Windows window here ({sorted(info)}, driver "
                       f"{pygame.display.get_driver()}); on Wayland run with SDL_VIDEODRIVER=x11")


class PygameHost(SurfaceHost):
    """A pygame (SDL2) window; wgpu draws into it through a Vulkan surface, not OpenGL.

    Make it before any device exists: it restricts wgpu to Vulkan (vulkan_only()).

    Args:
        size: (width, height) in pixels.
        title: the window's title.
        device: a GPUDevice, or None for wgpu's shared default device.
        vsync: wait for the display's refresh on present().

    Raises:
        ImportError: pygame is missing (`pip install "meganeura[demo]"`).
    """

    def __init__(self, size=(640, 480), title: str = "meganeura", device=None, vsync: bool = False):
        vulkan_only()
        pygame = optional("pygame", "PygameHost")
        self._pg = pygame
        pygame.display.init()
        self.window = pygame.display.set_mode(size, pygame.RESIZABLE)
        pygame.display.set_caption(title)
        super().__init__(pygame_present_info(vsync), size, device)

    def poll(self) -> bool:
        pg = self._pg
        for event in pg.event.get():
            if event.type == pg.QUIT or (event.type == pg.KEYDOWN and event.key == pg.K_ESCAPE):
                self.running = False
            elif event.type == pg.VIDEORESIZE and event.w > 0 and event.h > 0:
                self.resize((event.w, event.h))
        return self.running

    def close(self) -> None:
        if not self._closed:
            self._release_surface()
            self._pg.display.quit()
        self._closed, self.running = True, False


class GlfwHost(SurfaceHost):
    """A glfw window, with no client API (wgpu draws into it through a surface).

    Args:
        size: (width, height) in pixels.
        title: the window's title.
        device: a GPUDevice, or None for wgpu's shared default device.
        vsync: wait for the display's refresh on present().

    Raises:
        ImportError: glfw is missing (`pip install "meganeura[demo]"`).
        RuntimeError: no display, or no window could be made.
    """

    def __init__(self, size=(640, 480), title: str = "meganeura", device=None, vsync: bool = False):
        vulkan_only()
        glfw = optional("glfw", "GlfwHost")
        from wgpu.utils.glfw_present_info import get_glfw_present_info

        self._glfw = glfw
        if not glfw.init():
            raise RuntimeError("glfw.init() failed: is there a display (DISPLAY / WAYLAND_DISPLAY)?")
        glfw.window_hint(glfw.CLIENT_API, glfw.NO_API)
        glfw.window_hint(glfw.RESIZABLE, True)
        self.window = glfw.create_window(int(size[0]), int(size[1]), title, None, None)
        if not self.window:
            raise RuntimeError("glfw could not create a window")
        super().__init__(get_glfw_present_info(self.window, vsync=vsync), size, device)

    def poll(self) -> bool:
        glfw = self._glfw
        glfw.poll_events()
        if glfw.window_should_close(self.window):
            self.running = False
        w, h = glfw.get_framebuffer_size(self.window)
        if (w, h) != self.size and w > 0 and h > 0:
            self.resize((w, h))
        return self.running

    def close(self) -> None:
        if not self._closed:
            self._release_surface()
            self._glfw.destroy_window(self.window)
        self._closed, self.running = True, False


def pygfx_texture(texture):
    """The wgpu GPUTexture behind a pygfx Texture (made on pygfx's device if it does not exist yet).

    Render into it with gfx.WgpuRenderer(texture); then TextureInput reads it, and a
    TextureHost (or TensorOverlay.composite) draws over it, all on pygfx's own device."""
    from pygfx.renderers.wgpu.engine.update import ensure_wgpu_object

    return ensure_wgpu_object(texture)

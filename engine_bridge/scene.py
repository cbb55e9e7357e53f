"""PatternScene: a stand-in for the host's renderer, for examples and tests.

It renders coloured discs moving over a dark background into `self.texture`
(rgba8unorm, sampleable), so that a per-pixel colour model has something to find.
"""
from __future__ import annotations

import numpy as np

from .device import load_wgsl


class PatternScene:
    """An animated test pattern rendered into `texture` (size: width, height) on `device`: a
    stand-in for the host's renderer."""

    def __init__(self, device, size=(128, 128), format: str = "rgba8unorm"):
        import wgpu

        self.device = device
        w, h = size
        self.texture = device.create_texture(
            size=(w, h, 1), format=format, label="pattern scene",
            usage=wgpu.TextureUsage.RENDER_ATTACHMENT | wgpu.TextureUsage.TEXTURE_BINDING | wgpu.TextureUsage.COPY_SRC)
        self._view = self.texture.create_view()
        module = device.create_shader_module(code=load_wgsl("pattern.wgsl"))
        self._pipeline = device.create_render_pipeline(
            layout="auto", vertex={"module": module, "entry_point": "vs"}, primitive={"topology": "triangle-list"},
            fragment={"module": module, "entry_point": "fs", "targets": [{"format": format}]}, label="pattern")
        self._uniform = device.create_buffer(size=16, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        self._group = device.create_bind_group(layout=self._pipeline.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": self._uniform, "offset": 0, "size": 16}}])
        self._time = 0.0

    def draw(self, encoder, time=None, pass_kwargs=None) -> None:
        """Render the scene at `time` (seconds; None keeps the last time: no upload at all)."""
        if time is not None and time != self._time:
            self._time = float(time)  # the host's own per-frame upload: 16 bytes
            self.device.queue.write_buffer(self._uniform, 0, np.array([time, 0, 0, 0], np.float32).tobytes())
        rp = encoder.begin_render_pass(color_attachments=[{
            "view": self._view, "load_op": "clear", "store_op": "store", "clear_value": (0, 0, 0, 1)}],
            **(pass_kwargs or {}))
        rp.set_pipeline(self._pipeline)
        rp.set_bind_group(0, self._group)
        rp.draw(3)
        rp.end()

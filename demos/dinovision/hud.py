"""A heads-up display: a few lines of text drawn over the frame on the GPU (a glyph atlas
made once with Pillow's built-in font; each frame uploads only the characters)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

GLYPH = (7, 12)  # atlas cell: width, height


def glyph_atlas() -> np.ndarray:
    """[6 * 12, 16 * 7] uint8: ASCII 32..127 in a 16-column grid."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=10) if hasattr(ImageFont, "load_default") else None
    w, h = GLYPH
    img = Image.new("L", (16 * w, 6 * h), 0)
    draw = ImageDraw.Draw(img)
    for code in range(32, 128):
        i = code - 32
        draw.text(((i % 16) * w, (i // 16) * h - 1), chr(code), fill=255, font=font)
    return np.asarray(img)


class Hud:
    def __init__(self, device, target_format: str, cols: int = 34, rows: int = 6, scale: int = 2):
        import wgpu

        self.device, self.cols, self.rows, self.scale = device, cols, rows, scale
        atlas = glyph_atlas()
        tex = device.create_texture(size=(atlas.shape[1], atlas.shape[0], 1), format="r8unorm",
                                    usage=wgpu.TextureUsage.TEXTURE_BINDING | wgpu.TextureUsage.COPY_DST)
        device.queue.write_texture({"texture": tex}, atlas.tobytes(), {"bytes_per_row": atlas.shape[1]},
                                   (atlas.shape[1], atlas.shape[0], 1))
        self.params = device.create_buffer(size=32, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        self.text = device.create_buffer(size=cols * rows * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST)
        code = (Path(__file__).parent / "shaders" / "hud.wgsl").read_text()
        module = device.create_shader_module(code=code)
        self.pipeline = device.create_render_pipeline(
            layout="auto", vertex={"module": module, "entry_point": "vs"}, primitive={"topology": "triangle-list"},
            fragment={"module": module, "entry_point": "fs", "targets": [{
                "format": target_format, "blend": {
                    "color": {"src_factor": "src-alpha", "dst_factor": "one-minus-src-alpha", "operation": "add"},
                    "alpha": {"src_factor": "one", "dst_factor": "one-minus-src-alpha", "operation": "add"}}}]})
        self.group = device.create_bind_group(layout=self.pipeline.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": self.params, "offset": 0, "size": 32}},
            {"binding": 1, "resource": {"buffer": self.text, "offset": 0, "size": self.text.size}},
            {"binding": 2, "resource": tex.create_view()}])
        self.set_origin(8, 8)

    def set_origin(self, x: float, y: float) -> None:
        w, h = GLYPH
        p = np.zeros(8, np.float32)
        p[0:4] = [x, y, w * self.scale, h * self.scale]
        p[4:8].view(np.uint32)[:] = [self.cols, self.rows, w, h]
        self.device.queue.write_buffer(self.params, 0, p.tobytes())

    def set_lines(self, lines) -> None:
        grid = np.full((self.rows, self.cols), 32, np.uint32)
        for r, line in enumerate(list(lines)[:self.rows]):
            codes = [min(ord(ch), 127) for ch in line[:self.cols]]
            grid[r, :len(codes)] = codes
        self.device.queue.write_buffer(self.text, 0, grid.tobytes())

    def draw(self, encoder, target_view) -> None:
        rp = encoder.begin_render_pass(color_attachments=[{"view": target_view, "load_op": "load",
                                                           "store_op": "store"}])
        rp.set_pipeline(self.pipeline)
        rp.set_bind_group(0, self.group)
        rp.draw(3)
        rp.end()

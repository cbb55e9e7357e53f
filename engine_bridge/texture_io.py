"""Textures in and out of a Session, on the GPU: no CPU copy per frame.

TextureInput: a render target or camera texture -> the Session's input tensor
(crop, bilinear resize, channel pick, (value - mean) / std, layout [pixels, channels],
NHWC or NCHW), by one compute dispatch writing straight into the input buffer.
TensorOverlay: a model output (scores [pixels, classes], NHWC or NCHW; one class is a
mask) -> an rgba8unorm overlay texture (argmax -> class colour with alpha), by one
compute dispatch reading the output buffer; `composite` draws it over the scene.

Each kernel has its CPU reference beside it: preprocess_reference, overlay_reference.
"""
from __future__ import annotations

import numpy as np

from .device import load_wgsl

# class colours (RGBA, 0-255): class 0 (background) is transparent
DEFAULT_PALETTE = np.array([
    (0, 0, 0, 0), (230, 25, 75, 160), (60, 180, 75, 160), (0, 130, 200, 160), (255, 225, 25, 160),
    (145, 30, 180, 160), (70, 240, 240, 160), (245, 130, 48, 160), (240, 50, 230, 160),
    (210, 245, 60, 160), (250, 190, 212, 160), (0, 128, 128, 160), (220, 190, 255, 160),
    (170, 110, 40, 160), (255, 250, 200, 160), (128, 0, 0, 160)], np.uint8)
LAYOUTS = ("pixels", "nhwc", "nchw")
_CHANNELS = "rgba"


def _geometry(shape, layout, size, what):
    """(batch, height, width, channels) and element strides (x, y, c, image) of a tensor."""
    shape = [int(d) for d in shape]
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: use one of {LAYOUTS}")
    if layout == "pixels":
        if len(shape) not in (2, 3):
            raise ValueError(f"{what} has shape {shape}; layout 'pixels' needs [pixels, channels] "
                             "or [batch, pixels, channels]")
        n, p, c = ([1] + shape) if len(shape) == 2 else shape
        if size is None:
            side = round(p ** 0.5)
            if side * side != p:
                raise ValueError(f"{what} has {p} pixels: give size=(height, width)")
            size = (side, side)
        h, w = size
        if h * w != p:
            raise ValueError(f"size {tuple(size)} is {h * w} pixels; {what} has {p}")
        return (n, h, w, c), (c, w * c, 1, p * c)
    if len(shape) not in (3, 4):
        raise ValueError(f"{what} has shape {shape}; layout {layout!r} needs 3 or 4 dimensions")
    shape = ([1] + shape) if len(shape) == 3 else shape
    if layout == "nhwc":
        n, h, w, c = shape
        strides = (c, w * c, 1, h * w * c)
    else:
        n, c, h, w = shape
        strides = (1, w, h * w, h * w * c)
    if size is not None and tuple(size) != (h, w):
        raise ValueError(f"size {tuple(size)} does not match {what}'s {h}x{w}")
    return (n, h, w, c), strides


def _tensor(session, program, name, kind):
    """The TensorInfo (runtime/records.py) of `program`'s input or output `name` (kind: "inputs" or "outputs")."""
    programs = session.package.parsed.programs
    p = programs.get(program)
    tensors = None if p is None else p.inputs if kind == "inputs" else p.outputs
    if tensors is None or name not in tensors:
        have = sorted(tensors) if tensors is not None else sorted(programs)
        raise KeyError(f"program {program!r} has no {kind[:-1]} {name!r} (it has {have})")
    return tensors[name]


def _check_texture(texture, usage, why):
    import wgpu

    if not texture.usage & usage:
        raise ValueError(f"texture {texture.label or ''!r} needs {why} usage")
    fmt = texture.format
    if fmt.startswith(("depth", "stencil")) or fmt.endswith(("uint", "sint")):
        raise ValueError(f"texture format {fmt} holds no colour values")
    if texture.dimension != wgpu.TextureDimension.d2:
        raise ValueError("only 2D textures are supported")


class TextureInput:
    """Write `texture` (normalised) into input `input` of `program`, once per record().

    One compute dispatch (crop, bilinear resize, (value - mean) / std) into the input's buffer.

    Args:
        session: the Session whose input it writes.
        texture: a GPUTexture with TEXTURE_BINDING usage (a render target, a camera frame).
        input: the input's name.
        program: the program the input belongs to.
        layout: "pixels" ([pixels, channels], or with a batch first), "nhwc" or "nchw".
        size: (height, width) of a "pixels" input that is not square.
        crop: (x, y, width, height) of the texture to read; None: all of it.
        mean: subtracted per channel (a number or one per channel).
        std: divides per channel after that.
        channels: which texture channels feed the input's, in order ("rgb", "bgr", ...).
        batch_index: which image of a batched input it writes.

    Raises:
        TypeError: the input is not f32.
        ValueError: shapes, channels, crop or std that do not fit the input.
    """

    def __init__(self, session, texture, input: str = "x", program: str = "infer", *, layout: str = "pixels",
                 size=None, crop=None, mean=0.0, std=1.0, channels: str = "rgb", batch_index: int = 0):
        import wgpu

        self.session, self.device = session, session.device
        self.tensor = t = _tensor(session, program, input, "inputs")
        if t.dtype != "f32":
            raise TypeError(f"input {input!r} is {t.dtype}; a texture feeds f32 inputs")
        (n, self.height, self.width, c), strides = _geometry(t.shape, layout, size, f"input {input!r}")
        if not 1 <= c <= 4 or len(channels) < c or any(ch not in _CHANNELS for ch in channels[:c]):
            raise ValueError(f"input {input!r} has {c} channels; channels={channels!r} must name {c} of 'rgba'")
        if not 0 <= batch_index < n:
            raise ValueError(f"batch_index {batch_index} is outside the batch of {n}")
        self.channels = channels[:c]
        self.mean = np.broadcast_to(np.asarray(mean, np.float32), (c,)).copy()
        self.std = np.broadcast_to(np.asarray(std, np.float32), (c,)).copy()
        if (self.std == 0).any():
            raise ValueError("std must not be 0")
        self.layout, self.batch_index, self.strides = layout, batch_index, strides
        self.target = session.buffers[t.buffer]
        self.dispatches = 1
        self._pipeline = self.device.create_compute_pipeline(
            layout="auto", compute={"module": self.device.create_shader_module(code=load_wgsl("to_tensor.wgsl")),
                                    "entry_point": "main"}, label="texture->tensor")
        self._params = self.device.create_buffer(size=112, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        self._crop_arg = crop
        self.set_texture(texture)

    def set_texture(self, texture, crop=None) -> None:
        """Read from another texture (e.g. a new camera frame) from now on; uploads 112 bytes."""
        import wgpu

        _check_texture(texture, wgpu.TextureUsage.TEXTURE_BINDING, "TEXTURE_BINDING")
        crop = crop if crop is not None else self._crop_arg
        x0, y0, cw, ch = crop if crop is not None else (0, 0, texture.width, texture.height)
        if cw < 1 or ch < 1 or x0 < 0 or y0 < 0 or x0 + cw > texture.width or y0 + ch > texture.height:
            raise ValueError(f"crop {(x0, y0, cw, ch)} is outside the {texture.width}x{texture.height} texture")
        self.texture, self.crop = texture, (int(x0), int(y0), int(cw), int(ch))
        c = len(self.channels)
        sx, sy, sc, image = self.strides
        params = np.zeros(28, np.float32)
        params[0:c] = self.mean
        params[4:4 + c] = 1.0 / self.std
        params[8:16].view(np.uint32)[:] = [sx, sy, sc, image * self.batch_index] + [
            _CHANNELS.index(ch) for ch in self.channels.ljust(4, "r")]
        params[16:22] = [x0, y0, cw / self.width, ch / self.height, cw - 1, ch - 1]
        params[22:25].view(np.uint32)[:] = [self.width, self.height, c]
        self.device.queue.write_buffer(self._params, 0, params.tobytes())
        self._group = self.device.create_bind_group(layout=self._pipeline.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": texture.create_view()},
            {"binding": 1, "resource": {"buffer": self._params, "offset": 0, "size": 112}},
            {"binding": 2, "resource": {"buffer": self.target, "offset": 0, "size": self.target.size}}])

    def record(self, encoder, pass_kwargs=None) -> None:
        cpass = encoder.begin_compute_pass(**(pass_kwargs or {}))
        cpass.set_pipeline(self._pipeline)
        cpass.set_bind_group(0, self._group)
        cpass.dispatch_workgroups(-(-self.width // 8), -(-self.height // 8), 1)
        cpass.end()

    def reference(self, image) -> np.ndarray:
        """What record() writes for `image` (H x W x 4 values as the shader reads them), in the tensor's shape."""
        out = preprocess_reference(image, (self.height, self.width), self.crop, self.mean, self.std,
                                   self.channels, self.layout)
        shape = self.tensor.shape
        return out.reshape(shape) if int(np.prod(shape)) == out.size else out


class TensorOverlay:
    """Turn output `output` of `program` into `self.texture` (rgba8unorm), once per record().

    One compute dispatch: argmax over the classes -> the class's colour (drawn by composite()).

    Args:
        session: the Session whose output it reads.
        output: the output's name: scores [pixels, classes], NHWC or NCHW (one class: a mask).
        program: the program the output belongs to.
        layout: "pixels", "nhwc" or "nchw".
        size: (height, width) of a "pixels" output that is not square.
        palette: RGBA rows (0-255), one per class; None: DEFAULT_PALETTE (class 0 clear).
        threshold: a one-class mask colours the pixels whose score is above it.
        batch_index: which image of a batched output it shows.

    Raises:
        TypeError: the output is not f32.
        ValueError: shapes or a palette that do not fit the output.
    """

    def __init__(self, session, output: str = "logits", program: str = "infer", *, layout: str = "pixels",
                 size=None, palette=None, threshold: float = 0.0, batch_index: int = 0):
        import wgpu

        self.session, self.device = session, session.device
        self.tensor = t = _tensor(session, program, output, "outputs")
        if t.dtype != "f32":
            raise TypeError(f"output {output!r} is {t.dtype}; the overlay reads f32 scores")
        (n, self.height, self.width, self.classes), strides = _geometry(t.shape, layout, size, f"output {output!r}")
        if not 0 <= batch_index < n:
            raise ValueError(f"batch_index {batch_index} is outside the batch of {n}")
        palette = DEFAULT_PALETTE if palette is None else np.asarray(palette)
        if palette.ndim != 2 or palette.shape[1] != 4 or len(palette) < max(self.classes, 2):
            raise ValueError(f"palette needs one RGBA row per class ({max(self.classes, 2)} rows)")
        self.palette = palette.astype(np.uint8) if palette.dtype.kind in "iu" else np.round(
            np.clip(palette, 0, 1) * 255).astype(np.uint8)
        self.layout, self.threshold, self.batch_index = layout, float(threshold), batch_index
        self.source, offset = session.buffers[t.buffer], t.offset
        self.dispatches = 1
        dev = self.device
        self.texture = dev.create_texture(
            size=(self.width, self.height, 1), format="rgba8unorm", label=f"overlay {output}",
            usage=wgpu.TextureUsage.STORAGE_BINDING | wgpu.TextureUsage.TEXTURE_BINDING | wgpu.TextureUsage.COPY_SRC)
        pal = dev.create_buffer(size=len(self.palette) * 16, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST)
        dev.queue.write_buffer(pal, 0, (self.palette.astype(np.float32) / 255).tobytes())
        params = np.zeros(8, np.uint32)
        sx, sy, sc, image = strides
        params[:7] = [sx, sy, sc, image * batch_index, self.width, self.height, self.classes]
        params[7:8].view(np.float32)[0] = self.threshold
        ubuf = dev.create_buffer(size=32, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        dev.queue.write_buffer(ubuf, 0, params.tobytes())
        self._pipeline = dev.create_compute_pipeline(
            layout="auto", compute={"module": dev.create_shader_module(code=load_wgsl("overlay.wgsl")),
                                    "entry_point": "main"}, label="tensor->overlay")
        self._group = dev.create_bind_group(layout=self._pipeline.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": self.source, "offset": offset, "size": self.source.size - offset}},
            {"binding": 1, "resource": {"buffer": pal, "offset": 0, "size": pal.size}},
            {"binding": 2, "resource": {"buffer": ubuf, "offset": 0, "size": 32}},
            {"binding": 3, "resource": self.texture.create_view()}])
        self._compositor = None

    def record(self, encoder, pass_kwargs=None) -> None:
        cpass = encoder.begin_compute_pass(**(pass_kwargs or {}))
        cpass.set_pipeline(self._pipeline)
        cpass.set_bind_group(0, self._group)
        cpass.dispatch_workgroups(-(-self.width // 8), -(-self.height // 8), 1)
        cpass.end()

    def composite(self, encoder, target, background=None, viewport=None, smooth=False, pass_kwargs=None) -> None:
        """Draw the overlay (alpha-blended) over `target` (a texture or view), in one render pass.

        With `background` (a texture), it is drawn first, filling the target; without, the
        target keeps what the host rendered into it. `viewport`: (x, y, w, h) in pixels.
        """
        if self._compositor is None:
            self._compositor = Compositor(self.device)
        self._compositor.draw(encoder, target, self.texture, background, viewport, smooth, pass_kwargs)

    def reference(self, scores) -> np.ndarray:
        """The overlay (H x W x 4 uint8) record() makes from `scores` (the output, as Session.run returns it)."""
        return overlay_reference(scores, self.layout, (self.height, self.width), self.palette,
                                 self.threshold, self.batch_index)


class Compositor:
    """Draws textures over a target: a background copy, then alpha-blended overlays."""

    def __init__(self, device):
        self.device = device
        self._module = device.create_shader_module(code=load_wgsl("composite.wgsl"))
        self._pipelines = {}
        self._samplers = {f: device.create_sampler(mag_filter=f, min_filter=f) for f in ("nearest", "linear")}
        self._groups = {}

    def _pipeline(self, fmt, blend):
        key = (fmt, blend)
        if key not in self._pipelines:
            over = {"color": {"src_factor": "src-alpha", "dst_factor": "one-minus-src-alpha", "operation": "add"},
                    "alpha": {"src_factor": "one", "dst_factor": "one-minus-src-alpha", "operation": "add"}}
            self._pipelines[key] = self.device.create_render_pipeline(
                layout="auto", vertex={"module": self._module, "entry_point": "vs"},
                primitive={"topology": "triangle-list"},
                fragment={"module": self._module, "entry_point": "fs",
                          "targets": [{"format": fmt, **({"blend": over} if blend else {})}]},
                label=f"composite {fmt}{' blend' if blend else ''}")
        return self._pipelines[key]

    def _group(self, pipeline, texture, filt):
        key = (id(pipeline), id(texture), filt)
        if key not in self._groups:
            if len(self._groups) > 64:
                self._groups.clear()
            self._groups[key] = (texture, self.device.create_bind_group(
                layout=pipeline.get_bind_group_layout(0),
                entries=[{"binding": 0, "resource": texture.create_view()},
                         {"binding": 1, "resource": self._samplers[filt]}]))
        return self._groups[key][1]

    def draw(self, encoder, target, overlay, background=None, viewport=None, smooth=False, pass_kwargs=None):
        import wgpu

        view = target.create_view() if isinstance(target, wgpu.GPUTexture) else target
        fmt = (target if isinstance(target, wgpu.GPUTexture) else target.texture).format
        rp = encoder.begin_render_pass(color_attachments=[{
            "view": view, "load_op": "clear" if background is not None else "load", "store_op": "store",
            "clear_value": (0, 0, 0, 1)}], **(pass_kwargs or {}))
        if background is not None:
            pipe = self._pipeline(fmt, False)
            rp.set_pipeline(pipe)
            rp.set_bind_group(0, self._group(pipe, background, "linear"))
            rp.draw(3)
        if viewport is not None:
            rp.set_viewport(*viewport, 0.0, 1.0)
        pipe = self._pipeline(fmt, True)
        rp.set_pipeline(pipe)
        rp.set_bind_group(0, self._group(pipe, overlay, "linear" if smooth else "nearest"))
        rp.draw(3)
        rp.end()


# ------------------------------------------------------------------ CPU references
def preprocess_reference(image, size, crop=None, mean=0.0, std=1.0, channels="rgb", layout="pixels"):
    """numpy twin of to_tensor.wgsl. `image`: H x W x 4, values as the shader reads them
    (uint8 is divided by 255; -srgb formats: decode first). Returns [pixels, C], HWC or CHW."""
    img = np.asarray(image)
    img = img.astype(np.float32) / 255 if img.dtype == np.uint8 else img.astype(np.float32)
    h, w = size
    x0, y0, cw, ch = crop if crop is not None else (0, 0, img.shape[1], img.shape[0])
    img = img[y0:y0 + ch, x0:x0 + cw]

    def axis(n_out, n_in):
        s = np.maximum((np.arange(n_out, dtype=np.float32) + 0.5) * np.float32(n_in / n_out) - 0.5, 0)
        f = np.floor(s)
        return np.minimum(f, n_in - 1).astype(int), np.minimum(f + 1, n_in - 1).astype(int), (s - f)

    ya, yb, wy = axis(h, ch)
    xa, xb, wx = axis(w, cw)
    wx, wy = wx[None, :, None], wy[:, None, None]
    top = img[ya][:, xa] * (1 - wx) + img[ya][:, xb] * wx
    bottom = img[yb][:, xa] * (1 - wx) + img[yb][:, xb] * wx
    v = top * (1 - wy) + bottom * wy
    v = v[..., [_CHANNELS.index(c) for c in channels]]
    c = len(channels)
    v = (v - np.broadcast_to(np.asarray(mean, np.float32), (c,))) / np.broadcast_to(np.asarray(std, np.float32), (c,))
    if layout == "pixels":
        return v.reshape(h * w, c).astype(np.float32)
    return (v if layout == "nhwc" else v.transpose(2, 0, 1)).astype(np.float32)


def overlay_reference(scores, layout, size, palette=DEFAULT_PALETTE, threshold=0.0, batch_index=0):
    """numpy twin of overlay.wgsl: H x W x 4 uint8 class colours."""
    (n, h, w, c), _ = _geometry(np.shape(scores), layout, size, "scores")
    s = np.asarray(scores, np.float32)
    if layout == "pixels" or layout == "nhwc":
        s = s.reshape(n, h, w, c)
    else:
        s = s.reshape(n, c, h, w).transpose(0, 2, 3, 1)
    s = s[batch_index]
    cls = (s[..., 0] > threshold).astype(int) if c == 1 else np.argmax(s, axis=-1)
    return np.asarray(palette, np.uint8)[cls]


def srgb_to_linear(image_u8) -> np.ndarray:
    """What a shader reads from an -srgb texture holding these bytes (alpha stays linear)."""
    v = np.asarray(image_u8, np.float32) / 255
    rgb = np.where(v[..., :3] <= 0.04045, v[..., :3] / 12.92, ((v[..., :3] + 0.055) / 1.055) ** 2.4)
    return np.concatenate([rgb, v[..., 3:]], axis=-1)


def read_texture(device, texture) -> np.ndarray:
    """Read a texture back to the CPU (blocking: for tests and screenshots, never inside a frame).

    4-byte formats (rgba8unorm, bgra8unorm as stored) give H x W x 4 uint8."""
    w, h = texture.width, texture.height
    bpp = {"rgba8unorm": 4, "rgba8unorm-srgb": 4, "bgra8unorm": 4, "bgra8unorm-srgb": 4,
           "rgba16float": 8, "rgba32float": 16}[texture.format]
    row = -(-w * bpp // 256) * 256
    data = device.queue.read_texture({"texture": texture, "mip_level": 0, "origin": (0, 0, 0)},
                                     {"offset": 0, "bytes_per_row": row, "rows_per_image": h}, (w, h, 1))
    dtype = {4: np.uint8, 8: np.float16, 16: np.float32}[bpp]
    arr = np.frombuffer(data, np.uint8).reshape(h, row)[:, :w * bpp].copy().view(dtype).reshape(h, w, 4)
    return arr[..., [2, 1, 0, 3]] if texture.format.startswith("bgra") else arr

"""Where the decoder's training labels come from, all on the GPU: the engine's class-ID
target ("auto-label") and the user's brush strokes, written straight into the training
program's `labels` and `label_mask` inputs. Nothing is uploaded per frame; a stroke
uploads the few cells it changed."""
from __future__ import annotations

from pathlib import Path

import numpy as np


class Labeler:
    def __init__(self, session, id_textures: list, label_shape, stride: int, classes: int,
                 program: str = "train_decoder"):
        import wgpu

        self.session, self.device = session, session.device
        p = session.package.programs[program]
        self.labels = session.buffers[session.tensors[p["inputs"]["labels"]]["buffer"]]
        self.mask = session.buffers[session.tensors[p["inputs"]["label_mask"]]["buffer"]]
        self.height, self.width = label_shape
        self.stride, self.classes, self.eyes = stride, classes, len(id_textures)
        cells = self.eyes * self.height * self.width
        dev = self.device
        code = (Path(__file__).parent / "shaders" / "labels.wgsl").read_text()
        self.pipeline = dev.create_compute_pipeline(
            layout="auto", compute={"module": dev.create_shader_module(code=code), "entry_point": "main"})
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST
        self.class_map = dev.create_buffer(size=64 * 4, usage=usage)
        self.brush = dev.create_buffer(size=cells * 4, usage=usage)
        self.brush_cells = np.full(cells, -1, np.int32)
        dev.queue.write_buffer(self.brush, 0, self.brush_cells.tobytes())
        self.set_class_map(np.arange(classes))
        self.auto_label = True
        self._params, self._groups = [], []
        for eye, tex in enumerate(id_textures):
            ub = dev.create_buffer(size=32, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
            self._params.append(ub)
            self._groups.append(dev.create_bind_group(layout=self.pipeline.get_bind_group_layout(0), entries=[
                {"binding": 0, "resource": tex.create_view()},
                {"binding": 1, "resource": {"buffer": ub, "offset": 0, "size": 32}},
                {"binding": 2, "resource": {"buffer": self.class_map, "offset": 0, "size": self.class_map.size}},
                {"binding": 3, "resource": {"buffer": self.brush, "offset": 0, "size": self.brush.size}},
                {"binding": 4, "resource": {"buffer": self.labels, "offset": 0, "size": self.labels.size}},
                {"binding": 5, "resource": {"buffer": self.mask, "offset": 0, "size": self.mask.size}}]))
        self._write_params()

    def _write_params(self):
        for eye, ub in enumerate(self._params):
            p = np.array([self.width, self.height, self.stride, eye * self.height * self.width,
                          int(self.auto_label), 0, 0, 0], np.uint32)
            self.device.queue.write_buffer(ub, 0, p.tobytes())

    def set_auto_label(self, on: bool) -> None:
        self.auto_label = bool(on)
        self._write_params()

    def set_class_map(self, mapping) -> None:
        """mapping[engine id] = model class, or -1 for ids the model should not learn from."""
        m = np.full(64, -1, np.int32)
        mapping = np.asarray(mapping, np.int32)
        m[:len(mapping)] = mapping
        self.device.queue.write_buffer(self.class_map, 0, m.tobytes())

    def paint(self, eye: int, x: float, y: float, radius: float, cls: int) -> None:
        """A brush dab at image pixel (x, y) of `eye`: cells within `radius` pixels become
        class `cls` (-1 erases). Uploads only the rows it touched."""
        gy, gx = np.mgrid[0:self.height, 0:self.width]
        cy, cx = (gy + 0.5) * self.stride, (gx + 0.5) * self.stride
        hit = (cx - x) ** 2 + (cy - y) ** 2 <= radius ** 2
        if not hit.any():
            return
        base = eye * self.height * self.width
        view = self.brush_cells[base:base + self.height * self.width].reshape(self.height, self.width)
        view[hit] = cls
        rows = np.nonzero(hit.any(axis=1))[0]
        lo, hi = base + rows[0] * self.width, base + (rows[-1] + 1) * self.width
        self.device.queue.write_buffer(self.brush, lo * 4, self.brush_cells[lo:hi].tobytes())

    def paint_cells(self, eye: int, cells, cls: int) -> None:
        """Label exactly `cells` (bool [label height, label width]) of `eye` as `cls` and
        clear the eye's other brush cells: a whole stroke at once (tests, scripted users)."""
        cells = np.asarray(cells, bool)
        if cells.shape != (self.height, self.width):
            raise ValueError(f"cells {cells.shape} != label grid {(self.height, self.width)}")
        base = eye * self.height * self.width
        view = self.brush_cells[base:base + self.height * self.width]
        view[:] = np.where(cells.ravel(), cls, -1)
        self.device.queue.write_buffer(self.brush, base * 4, view.tobytes())

    def clear_brush(self) -> None:
        self.brush_cells[:] = -1
        self.device.queue.write_buffer(self.brush, 0, self.brush_cells.tobytes())

    def record(self, encoder) -> None:
        cpass = encoder.begin_compute_pass()
        cpass.set_pipeline(self.pipeline)
        for group in self._groups:
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(-(-self.width // 8), -(-self.height // 8), 1)
        cpass.end()

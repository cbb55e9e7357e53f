"""The DinoVision app core: the scene rendered each frame, the model's mask drawn over it,
and the decoder fine-tuned on the device from the engine's labels and the user's brush.

Everything per frame stays on the GPU: the colour target becomes the model input, the
logits become the overlay, the ID target becomes training labels. Only the loss comes back,
frames later, through a non-blocking readback.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from meganeura.engine_bridge.texture_io import TensorOverlay, TextureInput
from meganeura.runtime import Package, Session

from .data import confusion, iou, miou, normalize
from .labels import Labeler
from .model import MEAN, STD, DemoConfig, compile_demo
from .scene import CLASSES, PALETTE, Scene, heldout_frames

BACKBONE_FILE = "dinovision_backbone.safetensors"
# the backbone ships with the source repository (assets/), not with the library wheel
ASSETS = Path(os.environ.get("MEGANEURA_ASSETS") or Path(__file__).resolve().parents[2] / "assets")
BACKBONE = ASSETS / BACKBONE_FILE


def overlay_palette(classes: int, alpha: float = 0.45) -> np.ndarray:
    """RGBA per class: the scene's palette, then distinct hues for classes taught live."""
    extra = [[255, 120, 220], [120, 255, 240], [255, 170, 40], [160, 110, 255], [255, 255, 255]]
    rows = [list(c) for c in PALETTE] + extra * 4
    pal = np.array(rows[:classes], np.float32) / 255.0
    return np.concatenate([pal, np.full((classes, 1), alpha, np.float32)], axis=1)


def load_backbone(path=None) -> dict:
    from safetensors.numpy import load_file

    path = Path(path) if path else BACKBONE
    if not path.is_file():
        raise FileNotFoundError(
            f"the DinoVision backbone weights are not at {path}. They ship with the source repository "
            "(assets/), not with the pip wheel: run the demo from a clone (bash scripts/demo.sh), pass "
            "--weights with a transformers Dinov2Model checkpoint, or build them with "
            f"'python -m meganeura.demos.dinovision.pretrain --out DIR' and set MEGANEURA_ASSETS=DIR")
    return load_file(str(path))


class DinoVision:
    def __init__(self, device, size: int = 128, eyes: int = 1, seed: int = 0, cfg: DemoConfig | None = None,
                 backbone_weights: dict | None = None, decoder_path=None, lr: float | None = None):
        cfg = cfg or DemoConfig(height=size, width=size, eyes=eyes)
        if lr is not None:
            cfg.lr = lr
        self.cfg, self.device = cfg, device
        t = time.perf_counter()
        weights = backbone_weights if backbone_weights is not None else load_backbone()
        # the demo compiles its own package: its kernels can go without the WGSL compiler's checks;
        # the frozen backbone's weights in f16: half the package and the same speed (README)
        self.session = Session(device, Package.from_bytes(compile_demo(cfg, weights, half_backbone=True)),
                               shader_checks=False)
        self.load_seconds = time.perf_counter() - t
        self.decoder_path = Path(decoder_path) if decoder_path else None
        self.restored = False
        if self.decoder_path and self.decoder_path.is_file():
            try:
                self.session.load_weights(self.decoder_path, strict=False)
                self.restored = True
            except ValueError as exc:  # another model's file, or damaged: start fresh, keep it
                print(f"dinovision: not restoring the decoder ({exc}); starting from the package's weights")
        self.scene = Scene(device, cfg.width, cfg.height, seed=seed, stereo=cfg.eyes == 2)
        enc = device.create_command_encoder()
        targets = [self.scene.render(enc, 0.0, eye) for eye in range(cfg.eyes)]
        device.queue.submit([enc.finish()])
        self.colour = [c for c, _ in targets]
        self.ids = [i for _, i in targets]
        self.inputs = [TextureInput(self.session, self.colour[e], input="pixel_values", program="infer",
                                    layout="nchw", mean=MEAN, std=STD, batch_index=e) for e in range(cfg.eyes)]
        self.overlays = [TensorOverlay(self.session, "logits", "infer", layout="nchw",
                                       palette=overlay_palette(cfg.classes), batch_index=e) for e in range(cfg.eyes)]
        self.labeler = Labeler(self.session, self.ids, cfg.label_shape, cfg.label_stride, cfg.classes)
        self.loss_readback = self.session.readback("train_decoder", "loss", depth=4)
        self.steps = 0
        self.losses = []  # (step, loss) as they arrive
        self._frame_count = 0
        self._eval_scene = None
        from collections import defaultdict

        self._gpu_ms = defaultdict(list)

    # ------------------------------------------------------------------ per frame
    def record_frame(self, encoder, t: float, train: int = 1, timer=None) -> None:
        """Render, infer, overlay, and `train` decoder steps on this frame, into `encoder`.
        With `timer` (engine_bridge.timing.GpuTimer, begun for this frame) each pass is timed."""
        def ts(label):
            w = timer.writes(label) if timer is not None else None
            return {"timestamp_writes": w} if w else {}

        for eye in range(self.cfg.eyes):
            self.scene.render(encoder, t, eye, **ts("render"))
        for inp in self.inputs:
            inp.record(encoder, ts("ml:input"))
        self.session.record(encoder, "infer", pass_kwargs=ts("ml:infer"))
        for ov in self.overlays:
            ov.record(encoder, ts("ml:overlay"))
        if train:
            self.labeler.record(encoder)
            for _ in range(int(train)):
                self.session.record(encoder, "train_decoder", pass_kwargs=ts("ml:train"))
                self.steps += 1
            self.loss_readback.record(encoder)
        self._frame_count += 1

    def submitted(self, timer=None) -> None:
        self.loss_readback.submitted()
        got = self.loss_readback.poll()
        if got is not None:
            self.losses.append((self.steps, float(got[1])))
        if timer is not None:
            timer.submitted()
            for label, _, ms in timer.poll():
                kind = "render" if label == "render" else "ml"
                self._gpu_ms[kind].append(ms)
                self._gpu_ms[label].append(ms) if label.startswith("ml:") else None

    def ml_times(self) -> dict:
        """Median GPU milliseconds per pass kind, from timestamp queries (as they arrived)."""
        return {k: float(np.median(v)) for k, v in self._gpu_ms.items() if v}

    def save_decoder(self, path=None) -> Path:
        """Write the decoder's weights (atomically: a crash keeps the previous file)."""
        path = Path(path or self.decoder_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.session.save_weights(path, only=["decoder.*"])
        return path

    def composite(self, encoder, target, eye: int = 0, viewport=None) -> None:
        self.overlays[eye].composite(encoder, target, background=self.colour[eye], viewport=viewport)

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, frames=None, classes=None) -> dict:
        """mIoU on held-out frames (never trained on), at the demo's resolution."""
        frames = frames or heldout_frames(8)
        cfg = self.cfg
        if self._eval_scene is None:  # made once: its pipelines cost seconds on lavapipe
            self._eval_scene = Scene(self.device, cfg.width, cfg.height, seed=frames[0][0], stereo=cfg.eyes == 2)
        scene = self._eval_scene
        conf = np.zeros((cfg.classes, cfg.classes), np.int64)
        for seed, t in frames:
            if scene.seed != seed:
                scene.reseed(seed)
            shots = [scene.read_frame(t, eye) for eye in range(cfg.eyes)]
            x = np.stack([normalize(rgb) for rgb, _ in shots])
            logits = self.session.run("infer", {"pixel_values": x})["logits"]
            pred = logits.argmax(1)
            target = np.stack([ids for _, ids in shots]).astype(np.int64)
            if classes is not None:  # map engine ids to the classes being measured
                target = np.asarray(classes)[target]
            conf += confusion(pred, target, cfg.classes)
        per_class = {CLASSES[c] if c < len(CLASSES) else f"class{c}": iou(conf, c) for c in range(cfg.classes)
                     if conf[c].sum() or conf[:, c].sum()}
        return {"miou": miou(conf), "per_class": per_class, "confusion": conf}

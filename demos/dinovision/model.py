"""DinoVision's model: a frozen DINOv2-architecture ViT backbone and a light segmentation
decoder, compiled into one package with two programs that share their tensors:

  infer           pixels [eyes, 3, H, W] -> backbone -> patch features (cached in a state)
                  -> decoder -> per-pixel class logits [eyes, classes, H, W]
  train_decoder   the cached features (copied first, so inference may run between its
                  chunks) -> decoder -> masked cross-entropy against per-pixel labels
                  -> AdamW on the decoder only. No second backbone pass.

Stereo is a batch of two eyes. Class 0 is background; unused class slots wait for
classes a user teaches live.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from meganeura.compiler import TrainConfig
from meganeura.compiler.ir.builder import Builder, Tensor
from meganeura.compiler.compile import compile_programs
from meganeura.compiler.models.dinov2 import Dinov2Config, dinov2
from meganeura.compiler.ir.training import attach_optimizer, label_checks

MEAN = (0.485, 0.456, 0.406)  # ImageNet normalisation, as DINOv2 expects
STD = (0.229, 0.224, 0.225)


def small_backbone() -> Dinov2Config:
    """The backbone shipped in assets/: DINOv2's architecture at a game-friendly size."""
    return Dinov2Config(hidden_size=192, num_hidden_layers=6, num_attention_heads=3, mlp_ratio=4.0,
                        patch_size=8, image_size=128, layerscale_value=1.0)


@dataclass
class DemoConfig:
    backbone: Dinov2Config = field(default_factory=small_backbone)
    height: int = 128
    width: int = 128
    eyes: int = 1
    classes: int = 12  # class slots: the scene's classes plus room for taught ones
    decoder_hidden: int = 128
    refine_channels: int = 32  # the pixel-level refinement convolutions
    label_stride: int = 1  # labels (and the training loss) at 1/label_stride of the image
    lr: float = 3e-3

    @property
    def grid(self) -> tuple:
        p = self.backbone.patch_size
        return self.height // p, self.width // p

    @property
    def label_shape(self) -> tuple:
        return self.height // self.label_stride, self.width // self.label_stride


def _refine(b: Builder, logits: Tensor, pixels: Tensor, cfg: DemoConfig, weights: dict, rng) -> Tensor:
    """Patch logits, upsampled, sharpened at the pixel level: two 3x3 convolutions over
    [upsampled logits, image] add a correction that follows the image's edges (patches
    alone cannot: at 64x64 with 8-pixel patches even perfect patch labels reach 0.56 mIoU)."""
    c, r = cfg.classes, cfg.refine_channels
    h, w = pixels.shape[2], pixels.shape[3]
    up = b.resize(logits, size=(h, w), mode="linear", transform="pytorch_half_pixel")

    def p(name, value):
        return b.param(name, weights.get(name, value))

    x = b.concat(up, pixels, axis=1)
    fan = (c + 3) * 9
    x = b.conv2d(x, p("decoder.refine1.weight", rng.uniform(-1, 1, (r, c + 3, 3, 3)) / np.sqrt(fan)),
                 padding=(1, 1, 1, 1)) + b.reshape(p("decoder.refine1.bias", np.zeros(r)), (1, r, 1, 1))
    x = b.relu(x)
    x = b.conv2d(x, p("decoder.refine2.weight", np.zeros((c, r, 3, 3))), padding=(1, 1, 1, 1)) \
        + b.reshape(p("decoder.refine2.bias", np.zeros(c)), (1, c, 1, 1))
    return up + x


def _decoder(b: Builder, feats: Tensor, cfg: DemoConfig, weights: dict, rng) -> Tensor:
    """patch features [eyes, N, D] -> logits [eyes, classes, gh, gw]."""
    d, h, c = cfg.backbone.hidden_size, cfg.decoder_hidden, cfg.classes
    gh, gw = cfg.grid

    def p(name, value):
        return b.param(name, weights.get(name, value))

    x = b.reshape(feats, (cfg.eyes * gh * gw, d))
    x = b.layer_norm(x, p("decoder.norm.weight", np.ones(d)), p("decoder.norm.bias", np.zeros(d)), eps=1e-6)
    x = b.linear(x, p("decoder.fc1.weight", rng.uniform(-1, 1, (h, d)) / np.sqrt(d)),
                 p("decoder.fc1.bias", np.zeros(h)))
    x = b.gelu(x)
    x = b.linear(x, p("decoder.fc2.weight", rng.uniform(-1, 1, (c, h)) / np.sqrt(h)),
                 p("decoder.fc2.bias", np.zeros(c)))
    return b.transpose(b.reshape(x, (cfg.eyes, gh, gw, c)), (0, 3, 1, 2))


def build_programs(cfg: DemoConfig, backbone_weights: dict | None = None, decoder_weights: dict | None = None,
                   seed: int = 0) -> dict:
    """Graphs for both programs (name -> Graph)."""
    bb = cfg.backbone
    gh, gw = cfg.grid
    n, d = gh * gw, bb.hidden_size
    # infer
    model = dinov2(bb, batch=cfg.eyes, height=cfg.height, width=cfg.width, weights=backbone_weights, seed=seed)
    b = Builder.extend(model)
    for name in list(b.g.params):
        b.g.frozen.add(name)
    hidden = b.outputs["last_hidden_state"]
    patches = b.slice(hidden, starts=(0, 1, 0), steps=(1, 1, 1), shape=(cfg.eyes, n, d))
    b.state("cache.features", (cfg.eyes, n, d))
    b.assign("cache.features", patches)
    lh, lw = cfg.label_shape
    pixels = Tensor(b, b.g.inputs["pixel_values"])
    small = pixels if cfg.label_stride == 1 else b.resize(pixels, size=(lh, lw), mode="linear",
                                                           transform="pytorch_half_pixel")
    b.state("cache.pixels", small.shape)
    b.assign("cache.pixels", small)
    rng = np.random.default_rng(seed + 1)
    logits = _decoder(b, patches, cfg, decoder_weights or {}, rng)
    logits = _refine(b, logits, pixels, cfg, decoder_weights or {}, rng)
    b.g.outputs = {"logits": logits.id}
    infer = b.g
    # train_decoder
    t = Builder()
    cached = t.state("cache.features", (cfg.eyes, n, d))
    own = t.state("train.features", (cfg.eyes, n, d))
    del own
    snapshot = t.op("broadcast_to", cached, shape=cached.shape)  # copied first: inference may run meanwhile
    t.assign("train.features", snapshot)
    cached_px = t.state("cache.pixels", (cfg.eyes, 3, lh, lw))
    t.state("train.pixels", (cfg.eyes, 3, lh, lw))
    px = t.op("broadcast_to", cached_px, shape=cached_px.shape)
    t.assign("train.pixels", px)
    rng = np.random.default_rng(seed + 1)
    logits = _decoder(t, snapshot, cfg, decoder_weights or {}, rng)
    logits = _refine(t, logits, px, cfg, decoder_weights or {}, rng)
    rows = cfg.eyes * lh * lw
    flat = t.reshape(t.transpose(logits, (0, 2, 3, 1)), (rows, cfg.classes))
    labels = t.input("labels", (rows,), "i32")
    mask = t.input("label_mask", (rows,))
    # the ID buffer's labels are checked on the GPU: one outside the classes skips the step, counted
    # (a frame with nothing labelled is a step that learns nothing, not a rejected one)
    kept, rejects = label_checks(t.e, labels.id, mask.id, cfg.classes, empty_rejects=False)
    loss = t.cross_entropy(flat, labels, Tensor(t, kept))
    t.output("loss", loss)
    train = attach_optimizer(t.g, loss.id, TrainConfig(optimizer="adamw", lr=cfg.lr, weight_decay=1e-4), rejects)
    return {"infer": infer, "train_decoder": train}


def compile_demo(cfg: DemoConfig, backbone_weights: dict | None = None, decoder_weights: dict | None = None,
                 seed: int = 0, half_backbone: bool = False) -> bytes:
    """The demo's package. `half_backbone`: the frozen backbone's matmul and convolution
    weights stored in half precision (compile_programs' weights="f16"; the decoder trains in f32)."""
    progs = build_programs(cfg, backbone_weights, decoder_weights, seed)
    meta = {"dinovision": {"height": cfg.height, "width": cfg.width, "eyes": cfg.eyes, "classes": cfg.classes,
                           "label_shape": list(cfg.label_shape), "mean": MEAN, "std": STD}}
    return compile_programs(progs, source={"kind": "dinovision"}, meta=meta, weights="f16" if half_backbone else "f32")

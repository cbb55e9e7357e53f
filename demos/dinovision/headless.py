"""Headless DinoVision: the same frame loop with no window. Measures mIoU on held-out
frames before and after fine-tuning, and writes PNG frames, metrics.json and a plot."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from .app import DinoVision, load_backbone
from .model import DemoConfig

FRAME_DT = 0.7  # simulated seconds between frames: the camera covers ground quickly
LEVEL_STEPS = 24  # a new scene layout ("level") every so many training steps (12 frames at 2 per frame)


def level_frames(steps_per_frame: int) -> int:
    """Frames per level: the decoder sees as many layouts per step whatever its steps per frame."""
    return max(1, LEVEL_STEPS // max(int(steps_per_frame), 2))


def backbone_from_args(args):
    """(config, weights): the shipped backbone, or DINOv2 weights in the transformers layout."""
    from .model import small_backbone

    if not args.weights:
        return small_backbone(), load_backbone()
    from .weights import dinov2_config_from_weights

    from safetensors.numpy import load_file

    w = load_file(args.weights)
    return dinov2_config_from_weights(w), w


def run_headless(args) -> dict:
    import wgpu  # noqa: F401  (fails early with a clear message when wgpu is missing)

    from meganeura.engine_bridge.texture_io import read_texture
    from meganeura.engine_bridge.timing import GpuTimer
    from meganeura.runtime.device import default_device

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    size = args.size or 96
    frames = args.frames if args.frames is not None else 150
    eyes = 2 if args.stereo else 1
    device = default_device()
    backbone, weights = backbone_from_args(args)
    cfg = DemoConfig(backbone=backbone, height=size, width=size, eyes=eyes)
    decoder = None if args.fresh else args.decoder
    app = DinoVision(device, cfg=cfg, backbone_weights=weights, decoder_path=decoder, seed=args.seed)
    print(f"device: {device.adapter.info['device']}; model {size}x{size}, {eyes} eye(s); "
          f"loaded in {app.load_seconds:.1f} s")
    before = app.evaluate()
    print(f"mIoU on held-out frames before fine-tuning: {before['miou']:.3f}")
    timer = GpuTimer(device) if "timestamp-query" in device.features else None
    frame_target = device.create_texture(size=(size * eyes, size, 1), format="rgba8unorm",
                                         usage=0x10 | 0x04 | 0x01)  # RENDER_ATTACHMENT | TEXTURE_BINDING | COPY_SRC
    timings, curve = [], [(0, before["miou"])]
    points = getattr(args, "eval_points", 6)
    every = max(1, frames // points) if points else frames + 1
    t0 = time.perf_counter()
    from tqdm import tqdm

    per_level = level_frames(args.steps_per_frame)
    # a bar on a terminal only: in logs and CI it would garble the lines around it
    bar = tqdm(range(frames), desc="frames", unit="frame", leave=False, disable=not sys.stderr.isatty())
    for f in bar:
        if f % per_level == 0:
            app.scene.reseed(args.seed + 1 + f // per_level)
        start = time.perf_counter()
        enc = device.create_command_encoder()
        if timer:
            timer.begin()
        app.record_frame(enc, f * FRAME_DT, train=args.steps_per_frame, timer=timer)
        if f % every == 0 or f == frames - 1:
            for eye in range(eyes):
                app.composite(enc, frame_target, eye, viewport=(eye * size, 0, size, size))
        if timer:
            timer.end(enc)
        device.queue.submit([enc.finish()])
        app.submitted(timer)
        cpu_ms = (time.perf_counter() - start) * 1e3
        timings.append({"frame": f, "cpu_ms": cpu_ms, "steps": app.steps})
        if app.losses:
            bar.set_postfix(steps=app.steps, loss=f"{app.losses[-1][1]:.3f}")
        if f % every == 0 or f == frames - 1:
            img = read_texture(device, frame_target)
            _save_png(out / f"frame_{f:04d}.png", img[..., :3])
        if points and f % every == 0:
            ev = app.evaluate()
            curve.append((app.steps, ev["miou"]))
            loss = f"{app.losses[-1][1]:.3f}" if app.losses else "not read back yet"
            bar.write(f"frame {f}: {app.steps} steps, loss {loss}, held-out mIoU {ev['miou']:.3f}")
    total = time.perf_counter() - t0
    after = app.evaluate()
    curve.append((app.steps, after["miou"]))
    print(f"mIoU on held-out frames after {app.steps} steps: {after['miou']:.3f}")
    ml = app.ml_times()
    metrics = {"miou_before": before["miou"], "miou_after": after["miou"], "steps": app.steps, "frames": frames,
               "size": size, "eyes": eyes, "per_class_iou_after": after["per_class"], "miou_curve": curve,
               "losses": app.losses, "seconds": total, "frame_timings": timings, "gpu_ms": ml,
               "device": device.adapter.info["device"]}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    _plot(out / "training.png", app.losses, curve)
    if decoder:
        app.save_decoder()
    print(f"wrote {out}/metrics.json, training.png and frames")
    return metrics


def _save_png(path, rgb):
    from PIL import Image

    Image.fromarray(np.ascontiguousarray(rgb)).save(path)


def _plot(path, losses, curve):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    if losses:
        s, v = zip(*losses)
        ax[0].plot(s, v)
    ax[0].set(title="decoder training loss", xlabel="step", ylabel="cross-entropy")
    if curve:
        s, v = zip(*curve)
        ax[1].plot(s, v, marker="o")
    ax[1].axhline(0.8, color="grey", ls=":")
    ax[1].set(title="held-out mIoU", xlabel="step", ylim=(0, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

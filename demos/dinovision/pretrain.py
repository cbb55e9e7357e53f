"""Pre-trains the demo's backbone with meganeura itself, on rendered frames and their
class-ID targets, and writes it to assets/ (small enough to ship).

    python -m demos.dinovision.pretrain --steps 1500 --batch 32 --out assets

The backbone (DINOv2 architecture, see model.small_backbone) learns with a temporary
per-patch head; only the backbone is kept: the demo's decoder starts untrained and is
fine-tuned live. Training alternates between two resolutions so that the features hold
at the sizes the demo runs at (position embeddings are interpolated like DINOv2's).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from meganeura.compiler import TrainConfig, compile_model
from meganeura.compiler.ir.builder import Builder
from meganeura.compiler.models.dinov2 import dinov2
from meganeura.runtime import Package, Session
from meganeura.runtime.device import default_device

from .data import confusion, downsample_ids, miou, render_dataset
from .model import small_backbone
from .scene import CLASSES, Scene, heldout_frames

HEAD = "pretrain_head."


def build(cfg, batch, size, classes, stride, seed=0):
    model = dinov2(cfg, batch=batch, height=size, width=size, seed=seed)
    b = Builder.extend(model)
    gh = size // cfg.patch_size
    d = cfg.hidden_size
    rng = np.random.default_rng(seed + 7)
    h = b.outputs["last_hidden_state"]
    x = b.reshape(b.slice(h, starts=(0, 1, 0), steps=(1, 1, 1), shape=(batch, gh * gh, d)), (batch * gh * gh, d))
    x = b.linear(x, b.param(HEAD + "weight", rng.uniform(-1, 1, (classes, d)) / math.sqrt(d)),
                 b.param(HEAD + "bias", np.zeros(classes)))
    x = b.transpose(b.reshape(x, (batch, gh, gh, classes)), (0, 3, 1, 2))
    lab = size // stride
    x = b.resize(x, size=(lab, lab), mode="linear", transform="pytorch_half_pixel")
    b.g.outputs = {"logits": b.reshape(b.transpose(x, (0, 2, 3, 1)), (batch * lab * lab, classes)).id}
    return b.build()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--frames", type=int, default=2048, help="rendered training frames per resolution")
    ap.add_argument("--sizes", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--stride", type=int, default=2, help="labels at 1/stride of the image")
    ap.add_argument("--out", default="assets")
    ap.add_argument("--tiny", action="store_true", help="a seconds-long smoke run (tests)")
    args = ap.parse_args(argv)
    cfg = small_backbone()
    if args.tiny:
        cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads = 1, 48, 2
    classes = len(CLASSES)
    t_start = time.perf_counter()
    device = default_device()
    print(f"device: {device.adapter.info['device']} ({device.adapter.info['backend_type']})")
    rng = np.random.default_rng(0)
    runs = {}
    for size in args.sizes:
        scene = Scene(device, size, size, seed=0)
        items = [(int(s), float(t)) for s, t in zip(rng.integers(0, 500, args.frames), rng.uniform(0, 120, args.frames))]
        bar = tqdm(total=len(items), desc=f"rendering {size}px", leave=False, disable=not sys.stderr.isatty())
        x, ids = render_dataset(scene, sorted(items), progress=lambda i: bar.update(1))
        bar.close()
        hx, hids = render_dataset(scene, heldout_frames(16 if not args.tiny else 2))
        model = build(cfg, args.batch, size, classes, args.stride)
        pkg = Package.from_bytes(compile_model(model, TrainConfig(loss="cross_entropy", optimizer="adamw", lr=args.lr,
                                                                  weight_decay=0.05, clip_norm=1.0)))
        runs[size] = {"session": Session(device, pkg), "x": x, "ids": ids, "hx": hx, "hids": hids}
    print(f"data and compile: {time.perf_counter() - t_start:.1f} s")
    active = None
    losses = []
    t_train = time.perf_counter()
    bar = tqdm(range(args.steps), desc="pre-training", disable=not sys.stderr.isatty())
    for step in bar:
        size = args.sizes[(step // 50) % len(args.sizes)]  # blocks of 50 steps per resolution
        r = runs[size]
        s = r["session"]
        if active is not None and active != size:  # hand the weights over
            s.set_weights(runs[active]["session"].weights())
        active = size
        warm = min(1.0, (step + 1) / 100)
        lr = args.lr * warm * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        s.write_tensor("optimizer.lr", np.float32(lr))
        idx = rng.integers(0, len(r["x"]), args.batch)
        labels = np.stack([downsample_ids(i, args.stride) for i in r["ids"][idx]]).reshape(-1)
        loss = float(s.run("train_step", {"pixel_values": r["x"][idx], "labels": labels})["loss"])
        losses.append(loss)
        if step % 25 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-25:]):.3f}", size=size)
    train_s = time.perf_counter() - t_train
    weights = runs[active]["session"].weights()
    result = {}
    for size, r in runs.items():
        s = r["session"]
        s.set_weights(weights)
        conf = np.zeros((classes, classes), np.int64)
        for i in range(0, len(r["hx"]), args.batch):  # the last batch is padded
            xb = r["hx"][i:i + args.batch]
            n = len(xb)
            if n < args.batch:
                xb = np.concatenate([xb, np.zeros((args.batch - n,) + xb.shape[1:], np.float32)])
            lab = size // args.stride
            pred = s.run("infer", {"pixel_values": xb})["logits"].reshape(args.batch, lab, lab, classes)[:n].argmax(-1)
            target = np.stack([downsample_ids(t, args.stride) for t in r["hids"][i:i + n]])
            conf += confusion(pred, target, classes)
        result[size] = miou(conf)
    backbone = {k: v for k, v in weights.items() if not k.startswith(HEAD)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from safetensors.numpy import save_file

    name = "dinovision_backbone" + ("_tiny" if args.tiny else "")
    save_file(backbone, str(out / f"{name}.safetensors"))
    info = {"script": "python -m demos.dinovision.pretrain " + " ".join(argv or []),
            "config": cfg.__dict__, "steps": args.steps, "batch": args.batch, "sizes": args.sizes,
            "frames_per_size": args.frames, "lr": args.lr, "train_seconds": round(train_s, 1),
            "total_seconds": round(time.perf_counter() - t_start, 1), "final_loss": float(np.mean(losses[-50:])),
            "heldout_miou_with_pretrain_head": result, "device": device.adapter.info["device"],
            "backend": device.adapter.info["backend_type"], "date": time.strftime("%Y-%m-%d"),
            "host": platform.node(), "parameters": int(sum(v.size for v in backbone.values()))}
    (out / f"{name}.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()

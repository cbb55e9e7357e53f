"""Offscreen: a scene rendered into a texture, segmented by a tiny per-pixel model that
trains inside the frame's ML budget, its overlay composited on top. No display needed.

    python examples/offscreen.py [--frames 120] [--budget 8] [--trace trace.json] [--png out.png]
"""
import argparse

import numpy as np
from meganeura.compiler import Builder, TrainConfig, compile_model
from meganeura.engine_bridge import (
    FrameScheduler,
    OffscreenHost,
    PatternScene,
    TensorOverlay,
    TextureInput,
    read_texture,
)
from meganeura.runtime import Package, Session

H = W = 32  # the model sees 32x32 pixels; classes: 0 dark, 1 red, 2 green, 3 blue


def colour_model(seed=0):
    rng, b = np.random.default_rng(seed), Builder()
    h = b.relu(b.linear(b.input("x", (H * W, 3)), b.param("fc1.weight", rng.normal(0, 0.5, (16, 3))),
                        b.param("fc1.bias", np.zeros(16))))
    b.output("logits", b.linear(h, b.param("fc2.weight", rng.normal(0, 0.5, (4, 16))), b.param("fc2.bias", np.zeros(4))))
    return Package.from_bytes(compile_model(b.build(), TrainConfig(optimizer="adamw", lr=0.05)))


def colour_batches(seed=0):  # random colours, labelled by their brightest channel (dim: class 0)
    rng = np.random.default_rng(seed)
    while True:
        x = rng.random((H * W, 3), dtype=np.float32) ** 2
        yield {"x": x, "labels": np.where(x.max(1) < 0.35, 0, x.argmax(1) + 1)}


def parse_args(argv=None, frames=120):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=frames, help="0: run until the window closes")
    ap.add_argument("--budget", type=float, default=8.0, help="ML milliseconds per frame")
    ap.add_argument("--trace", help="write a Chrome trace (Perfetto, chrome://tracing) here")
    ap.add_argument("--png", help="save the last frame here (needs pillow)")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    host = OffscreenHost((320, 240))
    # the driver compiles on threads; quick_start: cheap kernels first, the tuned ones swapped in
    # when they have compiled (the scheduler's estimates follow: each is the worst of its last four)
    loading = Session.load_in_background(host.device, colour_model(), quick_start=True)
    scene = PatternScene(host.device, (128, 128))
    loading_frames = 0
    while not loading.done():  # meanwhile the game's frames go on (a real one would draw loading.progress)
        enc = host.device.create_command_encoder()
        scene.draw(enc, loading_frames / 60)
        host.device.queue.submit([enc.finish()])
        loading_frames += 1
    session = loading.result()  # the Session, or the error that stopped it
    feed = TextureInput(session, scene.texture, size=(H, W))
    overlay = TensorOverlay(session, "logits", size=(H, W))
    sched = FrameScheduler(session, args.budget, before=[feed], after=[overlay], trace=args.trace)
    sched.train(colour_batches())
    sched.warm_up()
    while sched.frame < args.frames:
        enc = host.device.create_command_encoder()
        scene.draw(enc, sched.frame / 60, pass_kwargs=sched.timed("scene"))
        sched.record(enc)
        overlay.composite(enc, host.texture(), background=scene.texture, pass_kwargs=sched.timed("composite"))
        sched.submit(enc)
    sched.close()
    if args.png:
        from PIL import Image

        Image.fromarray(read_texture(host.device, host.texture())).save(args.png)
    print(f"offscreen: {loading_frames} frames drawn while the model loaded\n{sched.report()}")


if __name__ == "__main__":
    main()

"""pygfx and meganeura on one device: pygfx renders a scene into a texture, meganeura
reads that texture as its model input, trains and infers in the frame budget, and draws
the class overlay back over pygfx's image; no copy leaves the GPU.

    python examples/pygfx_shared_device.py [--frames 120] [--budget 8] [--png out.png]
"""
import numpy as np
import pygfx as gfx  # first: pygfx declares its device wishes at import
import wgpu
from meganeura.engine_bridge import FrameScheduler, TensorOverlay, TextureInput, pygfx_texture, read_texture
from meganeura.runtime import Session
from offscreen import H, W, colour_batches, colour_model, parse_args


def main(argv=None):
    args = parse_args(argv)
    target = gfx.Texture(dim=2, size=(256, 192, 1), format="rgba8unorm", usage=wgpu.TextureUsage.COPY_SRC)
    renderer, scene = gfx.WgpuRenderer(target), gfx.Scene()
    scene.add(gfx.Background.from_color("#101214"))
    balls = [gfx.Mesh(gfx.sphere_geometry(0.3), gfx.MeshBasicMaterial(color=c)) for c in ("#f02020", "#20e040", "#2040ff")]
    scene.add(*balls)
    camera = gfx.OrthographicCamera(2.4, 1.8)
    session = Session(None, colour_model())  # None: wgpu's shared default device, which is pygfx's
    assert session.device is renderer.device
    texture = pygfx_texture(target)
    feed = TextureInput(session, texture, size=(H, W))
    overlay = TensorOverlay(session, "logits", size=(H, W))
    sched = FrameScheduler(session, args.budget, before=[feed], after=[overlay], trace=args.trace)
    classes = sched.readback("logits")
    sched.train(colour_batches())
    sched.warm_up()
    latest = None
    while sched.frame < args.frames:
        for k, ball in enumerate(balls):
            a = sched.frame / 40 + 2.1 * k
            ball.local.position = (0.7 * np.cos(a), 0.5 * np.sin(1.3 * a), 0)
        renderer.render(scene, camera)  # pygfx submits its own command buffers first
        enc = session.device.create_command_encoder()
        sched.record(enc)
        overlay.composite(enc, texture)  # over pygfx's image, in place
        sched.submit(enc)
        latest = classes.poll() or latest
    sched.close()
    if args.png:
        from PIL import Image

        Image.fromarray(read_texture(session.device, texture)).save(args.png)
    counts = np.bincount(latest[1].argmax(1), minlength=4) if latest else None
    print(f"pygfx:\n{sched.report()}\npixels per class: {counts}")


if __name__ == "__main__":
    main()

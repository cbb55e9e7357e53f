"""A pygame window: the scene, a per-pixel model's classes overlaid, the model training
within the frame's ML budget. Esc or closing the window ends it.

    python examples/pygame_overlay.py [--frames 0] [--budget 8] [--trace trace.json]
"""
import time

from meganeura.engine_bridge import FrameScheduler, PatternScene, PygameHost, TensorOverlay, TextureInput
from meganeura.runtime import Session
from offscreen import H, W, colour_batches, colour_model, parse_args


def main(argv=None):
    args = parse_args(argv, frames=0)
    host = PygameHost((640, 480), "meganeura: pygame overlay")  # before any device: Vulkan-only wgpu
    session = Session(host.device, colour_model())
    scene = PatternScene(host.device, (256, 256))
    feed = TextureInput(session, scene.texture, size=(H, W))
    overlay = TensorOverlay(session, "logits", size=(H, W))
    sched = FrameScheduler(session, args.budget, before=[feed], after=[overlay], trace=args.trace)
    sched.train(colour_batches())
    sched.warm_up()
    start = time.perf_counter()
    while host.poll() and (not args.frames or sched.frame < args.frames):
        enc = host.device.create_command_encoder()
        scene.draw(enc, time.perf_counter() - start, pass_kwargs=sched.timed("scene"))
        sched.record(enc)
        overlay.composite(enc, host.texture(), background=scene.texture, pass_kwargs=sched.timed("composite"))
        sched.submit(enc)
        host.present()
    sched.close()
    host.close()
    print(f"pygame:\n{sched.report()}")


if __name__ == "__main__":
    main()

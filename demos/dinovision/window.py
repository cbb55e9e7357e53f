"""DinoVision in a window (pygame): the scene with the live mask over it, a HUD, and
brush labelling with the mouse. Training fits into an ML budget per frame."""
from __future__ import annotations

import time

import numpy as np

from .app import DinoVision
from .headless import FRAME_DT, backbone_from_args
from .hud import Hud
from .model import DemoConfig
from .scene import CLASSES

SCALE = 4  # window pixels per model pixel


def run_window(args, max_frames: int | None = None, screenshot: str | None = None) -> DinoVision:
    from meganeura.engine_bridge.hosts import PygameHost
    from meganeura.engine_bridge.timing import GpuTimer

    size = args.size or 128
    eyes = 2 if args.stereo else 1
    host = PygameHost((size * SCALE * eyes, size * SCALE), title="DinoVision (meganeura)")
    pg = host._pg
    device = host.device
    backbone, weights = backbone_from_args(args)
    cfg = DemoConfig(backbone=backbone, height=size, width=size, eyes=eyes)
    app = DinoVision(device, cfg=cfg, backbone_weights=weights, decoder_path=None if args.fresh else args.decoder,
                     seed=args.seed)
    hud = Hud(device, host.format, scale=2 if size * SCALE * eyes >= 900 else 1)
    timer = GpuTimer(device) if "timestamp-query" in device.features else None
    budget = args.budget_ms if args.budget_ms is not None else 12.0
    selected, painting, training, frame, t_sim = 2, 0, True, 0, 0.0
    fps, last = 0.0, time.perf_counter()
    loss_text, miou_text = "-", "-"
    eval_every = 300
    try:
        while host.running and (max_frames is None or frame < max_frames):
            for event in pg.event.get():
                if event.type == pg.QUIT or (event.type == pg.KEYDOWN and event.key == pg.K_ESCAPE):
                    host.running = False
                elif event.type == pg.VIDEORESIZE and event.w > 0 and event.h > 0:
                    host.resize((event.w, event.h))
                elif event.type == pg.KEYDOWN:
                    key = event.unicode.lower() if event.unicode else ""
                    if key.isdigit() and 0 < int(key) < cfg.classes:
                        selected = int(key)
                    elif key == "n":  # the next class slot nobody uses yet
                        selected = max(len(CLASSES), selected + 1) % cfg.classes or len(CLASSES)
                    elif key == "a":
                        app.labeler.set_auto_label(not app.labeler.auto_label)
                    elif key == "c":
                        app.labeler.clear_brush()
                    elif key == "t":
                        training = not training
                    elif key == "s":
                        app.save_decoder()
                elif event.type == pg.MOUSEBUTTONDOWN:
                    painting = {1: 1, 3: -1}.get(event.button, 0)
                elif event.type == pg.MOUSEBUTTONUP:
                    painting = 0
            if painting:
                mx, my = pg.mouse.get_pos()
                w, h = host.size
                eye = min(eyes - 1, int(mx / (w / eyes)))
                x = (mx - eye * w / eyes) / (w / eyes) * size
                y = my / h * size
                app.labeler.paint(eye, x, y, radius=size / 24, cls=selected if painting > 0 else -1)
            # training steps that fit the budget, from measured GPU times
            times = app.ml_times()
            per_step = times.get("ml:train", 1.0)
            spare = budget - times.get("ml:infer", 0.0) * (1.0 if frame else 0.0)
            steps = 0 if not training else int(np.clip(spare // max(per_step, 1e-3), 0, args.steps_per_frame * 2))
            if training and steps == 0 and frame % 4 == 0:
                steps = 1  # a device too slow for the budget (a CPU rasteriser) still learns, slowly
            enc = device.create_command_encoder()
            if timer:
                timer.begin()
            t_sim += FRAME_DT / 7
            app.record_frame(enc, t_sim, train=steps, timer=timer)
            target = host.texture()
            w, h = host.size
            for eye in range(eyes):
                app.composite(enc, target, eye, viewport=(eye * w // eyes, 0, w // eyes, h))
            now = time.perf_counter()
            fps = 0.9 * fps + 0.1 / max(now - last, 1e-6)
            last = now
            if app.losses:
                loss_text = f"{app.losses[-1][1]:.3f}"
            name = CLASSES[selected] if selected < len(CLASSES) else f"new class {selected}"
            hud.set_lines([f"fps {fps:5.1f}  frame {frame}", f"render {times.get('render', 0):5.2f} ms",
                           f"ML {times.get('ml:infer', 0) + times.get('ml:train', 0) * steps:6.2f} ms"
                           f" (budget {budget:.0f})", f"loss {loss_text}  mIoU {miou_text}",
                           f"steps {app.steps}  auto-label {'on' if app.labeler.auto_label else 'off'}",
                           f"brush: {name}"])
            hud.draw(enc, target.create_view() if hasattr(target, "create_view") else target)
            if timer:
                timer.end(enc)
            device.queue.submit([enc.finish()])
            app.submitted(timer)
            if screenshot and max_frames is not None and frame == max_frames - 1:
                from meganeura.engine_bridge.texture_io import read_texture

                from PIL import Image

                Image.fromarray(read_texture(device, target)[..., :3]).save(screenshot)
            host.present()
            frame += 1
            if frame % eval_every == 0:
                miou_text = f"{app.evaluate(frames=None)['miou']:.2f}"
    finally:
        if not args.fresh and args.decoder:
            app.save_decoder()
        host.close()
    return app

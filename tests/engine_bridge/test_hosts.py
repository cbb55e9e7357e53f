"""Hosts: frames presented with a model's classes overlaid, in a pygame window, a glfw window
(both under Xvfb when there is no display) and offscreen. Each test reads the last frame and
the overlay texture back (queue.read_texture, after the frame loop's work) and checks them
against Session.run on the same image."""
import numpy as np
from bridge_helpers import read_rgba8
from meganeura.engine_bridge import (
    DEFAULT_PALETTE,
    FrameScheduler,
    GlfwHost,
    OffscreenHost,
    PatternScene,
    PygameHost,
    TensorOverlay,
    TextureInput,
    preprocess_reference,
)
from meganeura.runtime import Session

H = W = 32
SIZE = (192, 160)  # 6 x 5 window pixels per model pixel


def present_overlay(host, package, frames=5):
    dev = host.device
    session = Session(dev, package)
    scene = PatternScene(dev, (96, 80))
    feed = TextureInput(session, scene.texture, size=(H, W), mean=0.45, std=0.25)
    overlay = TensorOverlay(session, "logits", size=(H, W))
    sched = FrameScheduler(session, 8.0, before=[feed], after=[overlay])
    for i in range(frames):
        assert host.poll()
        enc = dev.create_command_encoder()
        scene.draw(enc, 0.5 + 0.2 * i, pass_kwargs=sched.timed("scene"))
        sched.record(enc)
        target = host.texture()
        overlay.composite(enc, target, background=scene.texture, pass_kwargs=sched.timed("composite"))
        sched.submit(enc)
        if i == frames - 1:
            shown = read_rgba8(dev, target)  # the test reads the last frame, before it is presented
        host.present()
    sched.close()
    assert sched.frame == frames and all(f.render_ms is not None for f in list(sched.stats)[1:])

    image = read_rgba8(dev, scene.texture)
    logits = Session(dev, package).run("infer", {"x": feed.reference(image)})["logits"]
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0] > 1e-4).reshape(H, W)  # leave out near-ties (float rounding)
    assert clear.mean() > 0.95
    want = DEFAULT_PALETTE[np.argmax(logits, axis=1)].reshape(H, W, 4)
    got = read_rgba8(dev, overlay.texture)
    np.testing.assert_array_equal(got[clear], want[clear])
    assert len(np.unique(np.argmax(logits, axis=1))) >= 2  # something to see

    # the frame: the scene (bilinear) with the overlay (nearest) blended over it
    w, h = host.size
    background = preprocess_reference(image, (h, w), layout="nhwc")
    over = want[np.arange(h) // (h // H)][:, np.arange(w) // (w // W)] / 255
    a = over[..., 3:]
    frame = over[..., :3] * a + background * (1 - a)
    near = clear[np.arange(h) // (h // H)][:, np.arange(w) // (w // W)]
    assert np.abs(shown[..., :3] / 255 - frame)[near].max() <= 3 / 255
    return sched


def test_offscreen_host_frames_need_no_display(seg_package):
    present_overlay(OffscreenHost(SIZE), seg_package)


def test_windows_present_frames_with_the_overlay(display, seg_package):
    # glfw first: pygame.display.quit() closes its X connection, and Mesa's X11 WSI caches
    # per-connection state by address; a later connection at the same address (a glfw
    # window opened after it) would skip XFixes set-up, and Xlib ends the process on the
    # BadRequest. glfw keeps its connection open, so pygame's lands elsewhere.
    for make in (GlfwHost, PygameHost):
        host = make(SIZE, f"meganeura test ({make.__name__})")
        try:
            assert host.format in ("bgra8unorm", "rgba8unorm")
            present_overlay(host, seg_package)
        finally:
            host.close()
        assert not host.running

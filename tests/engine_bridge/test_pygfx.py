"""Bring your own device and texture: pygfx renders, meganeura reads pygfx's texture on
pygfx's own device; the result equals inference on the same image uploaded from the CPU."""
import time

import numpy as np
import pygfx as gfx
import wgpu
from bridge_helpers import read_buffer, read_rgba8
from meganeura.engine_bridge import FrameScheduler, TextureInput, preprocess_reference, pygfx_texture
from meganeura.runtime import Session

CROP, MEAN, STD = (8, 4, 80, 72), (0.4, 0.45, 0.5), (0.25, 0.2, 0.3)


def test_pygfx_and_meganeura_share_one_device(seg_package):
    target = gfx.Texture(dim=2, size=(96, 80, 1), format="rgba8unorm", usage=wgpu.TextureUsage.COPY_SRC)
    renderer, scene = gfx.WgpuRenderer(target), gfx.Scene()
    scene.add(gfx.Background.from_color("#202830"))
    for colour, x, y in (("#e02020", -0.5, 0.3), ("#20d040", 0.4, 0.2), ("#2040f0", 0.0, -0.4)):
        ball = gfx.Mesh(gfx.sphere_geometry(0.35), gfx.MeshBasicMaterial(color=colour))
        ball.local.position = (x, y, 0)
        scene.add(ball)
    renderer.render(scene, gfx.OrthographicCamera(2.4, 2.0))

    session = Session(None, seg_package)  # no device given: wgpu's shared default device
    assert session.device is renderer.device is gfx.renderers.wgpu.get_shared().device
    texture = pygfx_texture(target)
    assert texture.width == 96 and texture.height == 80
    feed = TextureInput(session, texture, size=(32, 32), crop=CROP, mean=MEAN, std=STD)
    sched = FrameScheduler(session, 8.0, before=[feed])
    rb = sched.readback("logits")
    enc = session.device.create_command_encoder()
    sched.record(enc)
    sched.submit(enc)
    end = time.monotonic() + 10
    while (got := rb.poll()) is None and time.monotonic() < end:
        time.sleep(0.001)
    assert got is not None

    image = read_rgba8(session.device, texture)  # pygfx's pixels, now on the CPU
    assert len(np.unique(image.reshape(-1, 4), axis=0)) >= 4  # background and three balls
    x = preprocess_reference(image, (32, 32), CROP, MEAN, STD)
    np.testing.assert_allclose(read_buffer(session, feed.tensor), x, rtol=0, atol=1e-5 * np.abs(x).max())
    cpu = Session(session.device, seg_package).run("infer", {"x": x})["logits"]  # uploaded from the CPU
    assert np.abs(got[1] - cpu).max() <= 1e-4 * np.abs(cpu).max()

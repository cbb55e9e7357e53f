"""Texture -> tensor and tensor -> overlay kernels against their numpy twins, full tensors."""
import numpy as np
import pytest
from bridge_helpers import identity_package, read_buffer, read_rgba8, upload_texture
from meganeura.engine_bridge import OffscreenHost, TensorOverlay, TextureInput, overlay_reference, preprocess_reference
from meganeura.runtime import Session


def rel(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def run_pass(device, *kernels):
    enc = device.create_command_encoder()
    for k in kernels:
        k.record(enc)
    device.queue.submit([enc.finish()])


@pytest.mark.parametrize("layout, shape, fmt, crop, channels", [
    ("pixels", [12 * 16, 3], "rgba8unorm", (5, 3, 50, 40), "rgb"),      # crop + downscale, [pixels, C]
    ("nhwc", [1, 12, 16, 3], "bgra8unorm", None, "bgr"),                # swizzled format, channel order
    ("nchw", [2, 3, 12, 16], "rgba16float", (60, 50, 8, 6), "rgb"),     # upscale 8x6 -> 16x12, 2nd image
    ("nchw", [1, 4, 12, 16], "rgba32float", (1, 2, 30, 31), "rgba"),    # float texture, 4 channels
])
def test_texture_input_matches_reference(device, layout, shape, fmt, crop, channels):
    rng = np.random.default_rng(0)
    img = rng.random((64, 72, 4))
    img = (img * 255).astype(np.uint8) if fmt.endswith("unorm") else img.astype(
        np.float16 if fmt == "rgba16float" else np.float32)
    session = Session(device, identity_package(shape))
    c = len(channels)
    mean, std = rng.random(c).astype(np.float32), (rng.random(c) + 0.5).astype(np.float32)
    batch_index = shape[0] - 1 if layout != "pixels" else 0
    feed = TextureInput(session, upload_texture(device, img, fmt), layout=layout, size=(12, 16), crop=crop,
                        mean=mean, std=std, channels=channels, batch_index=batch_index)
    run_pass(device, feed)
    got = read_buffer(session, feed.tensor)
    want = preprocess_reference(img, (12, 16), crop, mean, std, channels, layout)
    assert rel(got[batch_index] if layout != "pixels" else got, want) < 1e-5
    # the crop is resized like torch.nn.functional.interpolate(bilinear, align_corners=False)
    import torch  # the test extra's second oracle
    x0, y0, cw, ch = crop or (0, 0, 72, 64)
    src = torch.tensor(np.asarray(img, np.float32)[y0:y0 + ch, x0:x0 + cw]).permute(2, 0, 1)[None]
    ref = torch.nn.functional.interpolate(src, size=(12, 16), mode="bilinear", align_corners=False)[0]
    ref = ref[["rgba".index(k) for k in channels]].permute(1, 2, 0).numpy() / (255 if img.dtype == np.uint8 else 1)
    ref = (ref - mean) / std
    ours = want.reshape(12, 16, c) if layout in ("pixels", "nhwc") else want.transpose(1, 2, 0)
    assert rel(ours, ref) < 1e-5


def test_overlay_is_argmax_colours_for_each_layout(device):
    rng = np.random.default_rng(1)
    palette = rng.integers(0, 256, (5, 4)).astype(np.uint8)
    for layout, shape in (("pixels", [10 * 14, 5]), ("nhwc", [1, 10, 14, 5]), ("nchw", [5, 10, 14])):
        session = Session(device, identity_package(shape))
        scores = rng.standard_normal(shape).astype(np.float32)
        session.write_inputs("infer", {"x": scores})
        overlay = TensorOverlay(session, "y", layout=layout, size=(10, 14), palette=palette)
        enc = device.create_command_encoder()
        session.record(enc, "infer")
        overlay.record(enc)
        device.queue.submit([enc.finish()])
        got = read_rgba8(device, overlay.texture)
        hwc = scores.reshape(10, 14, 5) if layout != "nchw" else scores.transpose(1, 2, 0)
        np.testing.assert_array_equal(got, palette[np.argmax(hwc, axis=-1)])
        np.testing.assert_array_equal(got, overlay_reference(scores, layout, (10, 14), palette))
    # one channel is a mask: score > threshold
    session = Session(device, identity_package([8 * 8, 1]))
    scores = rng.standard_normal((64, 1)).astype(np.float32)
    session.write_inputs("infer", {"x": scores})
    overlay = TensorOverlay(session, "y", threshold=0.25)
    enc = device.create_command_encoder()
    session.record(enc, "infer")
    overlay.record(enc)
    device.queue.submit([enc.finish()])
    got = read_rgba8(device, overlay.texture)
    np.testing.assert_array_equal(got, overlay.palette[(scores[:, 0] > 0.25).astype(int)].reshape(8, 8, 4))


def test_composite_blends_the_overlay_over_the_scene(device):
    rng = np.random.default_rng(2)
    session = Session(device, identity_package([16 * 16, 3]))
    session.write_inputs("infer", {"x": rng.standard_normal((256, 3))})
    overlay = TensorOverlay(session, "y", palette=[(0, 0, 0, 0), (255, 0, 0, 128), (0, 255, 0, 255)])
    background = (rng.random((16, 16, 4)) * 255).astype(np.uint8)
    bg = upload_texture(device, background)
    host = OffscreenHost((16, 16), device)
    enc = device.create_command_encoder()
    session.record(enc, "infer")
    overlay.record(enc)
    overlay.composite(enc, host.texture(), background=bg)
    device.queue.submit([enc.finish()])
    over = read_rgba8(device, overlay.texture).astype(np.float64) / 255
    a = over[..., 3:]
    want = over[..., :3] * a + background[..., :3] / 255 * (1 - a)
    got = read_rgba8(device, host.texture())[..., :3] / 255
    assert np.abs(got - want).max() <= 1.5 / 255


def test_bad_arguments_get_clear_errors(device):
    import wgpu

    session = Session(device, identity_package([8 * 8, 3]))
    tex = upload_texture(device, np.zeros((8, 8, 4), np.uint8))
    with pytest.raises(ValueError, match="layout"):
        TextureInput(session, tex, layout="hwc")
    with pytest.raises(ValueError, match="size"):
        TextureInput(session, tex, size=(4, 4))
    with pytest.raises(ValueError, match="crop"):
        TextureInput(session, tex, crop=(4, 4, 8, 8))
    with pytest.raises(KeyError, match="no input 'image'"):
        TextureInput(session, tex, "image")
    with pytest.raises(ValueError, match="std"):
        TextureInput(session, tex, std=0)
    plain = device.create_texture(size=(8, 8, 1), format="rgba8unorm", usage=wgpu.TextureUsage.COPY_DST)
    with pytest.raises(ValueError, match="TEXTURE_BINDING"):
        TextureInput(session, plain)
    with pytest.raises(ValueError, match="palette"):
        TensorOverlay(session, "y", palette=[(0, 0, 0, 0), (1, 1, 1, 1)])

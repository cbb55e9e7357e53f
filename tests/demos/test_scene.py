"""The DinoVision scene renders colour and class-ID targets that agree with its geometry."""
import numpy as np
import pytest
import wgpu
from meganeura.demos.dinovision.scene import (
    CLASSES,
    GROUND_HALF,
    HELDOUT_SEED0,
    RING_SLOTS,
    Scene,
    colorize_ids,
    heldout_frames,
    training_seed,
)

W, H = 128, 96
GROUND, BACKGROUND = CLASSES.index("ground"), CLASSES.index("background")


@pytest.fixture(scope="module")
def scene(device):
    return Scene(device, W, H, seed=0, stereo=True)


def _ground_mask(scene, t, eye=0):
    """Pixels whose view ray hits the ground square (from the camera matrices alone)."""
    view, proj = scene.camera(t, eye)
    inv = np.linalg.inv(proj @ view)
    x, y = np.meshgrid((np.arange(scene.width) + 0.5) / scene.width * 2 - 1,
                       1 - (np.arange(scene.height) + 0.5) / scene.height * 2)
    ndc = np.stack([x, y, np.zeros_like(x), np.ones_like(x)], -1)
    near = ndc @ inv.T
    ndc[..., 2] = 1.0
    far = ndc @ inv.T
    o, f = near[..., :3] / near[..., 3:], far[..., :3] / far[..., 3:]
    d = f - o
    with np.errstate(divide="ignore", invalid="ignore"):
        s = -o[..., 1] / d[..., 1]
    hit = o + np.nan_to_num(s)[..., None] * d
    return (d[..., 1] < 0) & (s <= 1) & (np.abs(hit[..., 0]) <= GROUND_HALF) & (np.abs(hit[..., 2]) <= GROUND_HALF)


def test_targets_render_on_the_device(device, scene):
    encoder = device.create_command_encoder()
    colour, ids = scene.render(encoder, 1.0, eye=0)
    device.queue.submit([encoder.finish()])
    assert (colour.format, ids.format) == ("rgba8unorm", "r32uint")
    assert colour.size[:2] == ids.size[:2] == (W, H)
    for tex in (colour, ids):
        assert tex.usage & wgpu.TextureUsage.TEXTURE_BINDING and tex.usage & wgpu.TextureUsage.COPY_SRC
    rgb, lab = scene.read_targets(0)
    assert rgb.shape == (H, W, 3) and rgb.dtype == np.uint8
    assert lab.shape == (H, W) and lab.max() < len(CLASSES)
    assert rgb.std() > 10  # a picture, not a clear colour
    with pytest.raises(ValueError):
        scene.render(device.create_command_encoder(), 0.0, eye=2)  # stereo has eyes 0 and 1


def test_every_class_appears_and_looks_different(scene):
    seen, means = np.zeros(len(CLASSES), int), np.zeros((len(CLASSES), 3))
    for t in (0.0, 6.0, 12.0, 18.0):
        rgb, ids = scene.read_frame(t)
        counts = np.bincount(ids.ravel(), minlength=len(CLASSES))
        seen += counts
        for c in np.flatnonzero(counts):
            means[c] += rgb[ids == c].mean(0) * counts[c]
    assert (seen > 0).all(), dict(zip(CLASSES, seen))
    means /= seen[:, None]
    dist = np.linalg.norm(means[:, None] - means[None], axis=-1) + 1e9 * np.eye(len(CLASSES))
    assert dist.min() > 8, means.round()  # mean colours of the classes are not all alike


def test_ids_agree_with_the_geometry(scene):
    for t in (0.0, 9.5):
        _, ids = scene.read_frame(t)
        ground = _ground_mask(scene, t)
        # above the ground's silhouette only sky or objects; on it never sky (1 px edge tolerance)
        edge = ground ^ np.roll(ground, 1, 0) | ground ^ np.roll(ground, -1, 0)
        assert ((ids == GROUND) & ~ground & ~edge).sum() == 0
        assert ((ids == BACKGROUND) & ground & ~edge).sum() == 0
        assert (ids[0] == BACKGROUND).mean() > 0.9 and (ids[-1] != BACKGROUND).all()
        assert ground[-H // 4:].mean() > 0.9 and ground[: H // 5].mean() == 0  # camera looks at the horizon
        assert set(np.unique(ids)) - {GROUND, BACKGROUND}  # and some objects in view


def test_motion_changes_the_frame(scene):
    a_rgb, a_ids = scene.read_frame(3.0)
    b_rgb, b_ids = scene.read_frame(3.5)
    assert (a_ids != b_ids).mean() > 0.005
    assert np.abs(a_rgb.astype(int) - b_rgb).mean() > 1.0


def _best_shift(left, right, max_shift=12):
    """The horizontal shift d minimising mismatch of left[:, d:] against right[:, :-d]."""
    def mismatch(d):
        if d >= 0:
            return (left[:, d:] != right[:, :right.shape[1] - d]).mean()
        return (left[:, :d] != right[:, -d:]).mean()
    scores = {d: mismatch(d) for d in range(-max_shift, max_shift + 1)}
    return min(scores, key=scores.get), scores


def test_stereo_eyes_differ_by_a_small_horizontal_shift(scene):
    t = 4.0
    rgb0, ids0 = scene.read_frame(t, eye=0)
    rgb1, ids1 = scene.read_frame(t, eye=1)
    assert (ids0 != ids1).any() and (rgb0 != rgb1).any()
    # near objects only: the ground/sky edge lies at infinity and shows no disparity
    objects0, objects1 = np.where(ids0 > GROUND, ids0, 0), np.where(ids1 > GROUND, ids1, 0)
    d, scores = _best_shift(objects0, objects1)
    assert 1 <= d <= 6, scores  # left eye sees things further right
    assert scores[d] < scores[0]
    # the two eyes are the same camera moved along its right axis by the IPD
    (v0, p0), (v1, p1) = scene.camera(t, 0), scene.camera(t, 1)
    assert np.allclose(p0, p1)
    e0, e1 = np.linalg.inv(v0)[:3, 3], np.linalg.inv(v1)[:3, 3]
    assert np.isclose(np.linalg.norm(e1 - e0), scene.ipd)
    assert np.allclose(v0[:3, :3], v1[:3, :3])


def test_deterministic(device, scene):
    a = scene.read_frame(7.25, eye=1)
    scene.read_frame(1.0)
    scene.reseed(5)
    c = scene.read_frame(7.25, eye=1)
    scene.reseed(0)
    b = scene.read_frame(7.25, eye=1)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[1], c[1])  # another seed is another scene
    other = Scene(device, W, H, seed=0, stereo=True)
    d = other.read_frame(7.25, eye=1)
    assert np.array_equal(a[0], d[0]) and np.array_equal(a[1], d[1])


def test_many_renders_in_one_encoder(device, scene):
    """Each render() has its own uniform slot, so several frames can go into one submission."""
    times = [0.5, 2.0, 3.5]
    bufs, encoder = [], device.create_command_encoder()
    for t in times:
        colour, ids = scene.render(encoder, t)
        pair = []
        for tex in (colour, ids):
            buf = device.create_buffer(size=4 * W * H, usage=wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.MAP_READ)
            encoder.copy_texture_to_buffer({"texture": tex}, {"buffer": buf, "bytes_per_row": 4 * W,
                                                              "rows_per_image": H}, (W, H, 1))
            pair.append(buf)
        bufs.append(pair)
    device.queue.submit([encoder.finish()])
    assert len(times) <= RING_SLOTS
    for t, (cbuf, ibuf) in zip(times, bufs):
        rgb, ids = scene.read_frame(t)
        cbuf.map_sync(wgpu.MapMode.READ)
        ibuf.map_sync(wgpu.MapMode.READ)
        got_rgb = np.frombuffer(cbuf.read_mapped(), np.uint8).reshape(H, W, 4)[..., :3]
        got_ids = np.frombuffer(ibuf.read_mapped(), np.uint32).reshape(H, W)
        assert np.array_equal(got_rgb, rgb) and np.array_equal(got_ids, ids)


def test_heldout_frames_and_resize(scene):
    frames = heldout_frames(4)
    assert frames == heldout_frames(4) and len({s for s, _ in frames}) == 4
    assert all(s >= HELDOUT_SEED0 for s, _ in frames)
    assert training_seed(3) == 3
    with pytest.raises(ValueError):
        training_seed(frames[0][0])
    scene.reseed(frames[0][0])
    scene.resize(64, 48)
    try:
        rgb, ids = scene.read_frame(frames[0][1], eye=1)
        assert rgb.shape == (48, 64, 3) and ids.shape == (48, 64)
        assert {BACKGROUND, GROUND} <= set(np.unique(ids))
    finally:
        scene.reseed(0)
        scene.resize(W, H)


def test_preview_png(scene, tmp_path):
    from PIL import Image

    rows = []
    for t in (0.0, 8.0):
        rgb0, ids0 = scene.read_frame(t, eye=0)
        rgb1, _ = scene.read_frame(t, eye=1)
        rows.append(np.concatenate([rgb0, colorize_ids(ids0), rgb1], 1))
    img = Image.fromarray(np.concatenate(rows, 0)).resize((3 * W * 2, 2 * H * 2), Image.NEAREST)
    img.save(tmp_path / "scene_preview.png")
    img.save("/tmp/scene_preview.png")
    assert (tmp_path / "scene_preview.png").stat().st_size > 1000

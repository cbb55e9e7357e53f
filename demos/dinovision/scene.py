"""The DinoVision scene: a wgpu-rendered 3D world with a colour target and a class-ID target.

Textured primitives (crates, balls, rings, pillars, cones) stand and move on a grass ground
under a sky; a camera orbits through them on a path chosen by the seed; a sun lights them.
Each frame renders two targets for each eye: colour (rgba8unorm, sRGB-encoded bytes, as a
photograph) and the class index of every pixel (r32uint), the segmentation label.

    scene = Scene(device, 128, 128, seed=0, stereo=True)
    colour, ids = scene.render(encoder, t, eye=0)  # records one render pass into your encoder
    rgb, labels = scene.read_frame(t)              # submits and waits: tests and offline data

Textures are images that ship inside pip packages (scikit-image's bundled samples and
scikit-learn's sample images), so nothing is downloaded. Seeds below HELDOUT_SEED0 are for
training; `heldout_frames` names (seed, t) pairs from seeds above it for evaluation.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import wgpu

SHADERS = Path(__file__).parent / "shaders"

CLASSES = ["background", "ground", "crate", "ball", "ring", "pillar", "cone"]
# class -> (package, image name, tint for a grey image); layer i of the texture array is class i.
TEXTURES = {
    "background": None,
    "ground": ("skimage", "grass", (0.42, 0.72, 0.26)),
    "crate": ("skimage", "brick", (0.95, 0.52, 0.32)),
    "ball": ("skimage", "astronaut", None),
    "ring": ("sklearn", "china.jpg", None),
    "pillar": ("skimage", "gravel", (0.55, 0.68, 0.95)),
    "cone": ("sklearn", "flower.jpg", None),
}
PALETTE = np.array([[135, 190, 235], [70, 150, 60], [200, 90, 50], [240, 220, 60],
                    [60, 90, 220], [170, 170, 190], [230, 80, 200]], np.uint8)  # for ID previews
HELDOUT_SEED0 = 1_000_000  # scene seeds >= this are never used for training
RING_SLOTS = 16            # render() calls allowed per submitted encoder (uniform ring)
INSTANCES_PER_CLASS = 3
GROUND_HALF = 150.0        # the ground is a 300 m square; fog hides its edge

_FRAME_BYTES = 256        # one uniform slot (224 used), dynamic-offset aligned
_INST_FLOATS = 36         # model 16 | normal matrix 3 x vec4 | uv scale xy, specular | class id (u32) x 4
_Z_NEAR, _Z_FAR = 0.05, 500.0


def heldout_frames(n: int = 16, seed: int = 0) -> list[tuple[int, float]]:
    """n deterministic (scene_seed, t) pairs never seen in fine-tuning (seeds >= HELDOUT_SEED0)."""
    rng = np.random.default_rng([seed, 7919])
    return [(HELDOUT_SEED0 + seed * 10_000 + i, round(float(rng.uniform(0.0, 60.0)), 3)) for i in range(n)]


def training_seed(seed: int) -> int:
    """Check that `seed` is a training seed (below HELDOUT_SEED0) and return it."""
    if not 0 <= seed < HELDOUT_SEED0:
        raise ValueError(f"training seeds are 0..{HELDOUT_SEED0 - 1}; {seed} is held out")
    return seed


def colorize_ids(ids: np.ndarray) -> np.ndarray:
    """An ID map [H, W] as an RGB preview [H, W, 3] (PALETTE, unknown ids grey)."""
    pal = np.vstack([PALETTE, np.full((256 - len(PALETTE), 3), 128, np.uint8)])
    return pal[np.asarray(ids).astype(np.int64).clip(0, 255)]


# ----------------------------------------------------------------------------- textures

@functools.cache
def _source_image(package: str, name: str) -> np.ndarray:
    if package == "skimage":
        import skimage.data

        return getattr(skimage.data, name)()
    from sklearn.datasets import load_sample_image

    return load_sample_image(name)


@functools.cache
def class_textures(size: int = 128) -> np.ndarray:
    """[len(CLASSES), size, size, 4] uint8 (sRGB) albedo images, one per class (0: white)."""
    from skimage.transform import resize

    out = np.full((len(CLASSES), size, size, 4), 255, np.uint8)
    for i, name in enumerate(CLASSES):
        spec = TEXTURES[name]
        if spec is None:
            continue
        package, image, tint = spec
        img = _source_image(package, image).astype(np.float32) / 255.0
        h, w = img.shape[:2]
        s = min(h, w)
        img = img[(h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s]
        img = resize(img, (size, size), anti_aliasing=True, preserve_range=True)
        if img.ndim == 2:
            img = img[..., None] * np.asarray(tint if tint is not None else (1, 1, 1), np.float32)
        out[i, ..., :3] = np.clip(img[..., :3] * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return out


def _mip_chain(images: np.ndarray) -> list[np.ndarray]:
    """Box-filtered mip levels of [L, S, S, 4] sRGB images (averaged in linear light)."""
    lin = (images.astype(np.float32) / 255.0) ** 2.2
    levels = [images]
    while lin.shape[1] > 1:
        lin = 0.25 * (lin[:, ::2, ::2] + lin[:, 1::2, ::2] + lin[:, ::2, 1::2] + lin[:, 1::2, 1::2])
        levels.append(np.clip(lin ** (1 / 2.2) * 255.0 + 0.5, 0, 255).astype(np.uint8))
    return levels


# ----------------------------------------------------------------------------- meshes

def _grid(nu, nv, surface):
    """A (nu+1) x (nv+1) vertex grid: surface(u, v) -> (positions, normals) for u, v in [0, 1]."""
    u, v = np.meshgrid(np.linspace(0, 1, nu + 1), np.linspace(0, 1, nv + 1), indexing="ij")
    p, n = surface(u.ravel(), v.ravel())
    uv = np.stack([u.ravel(), v.ravel()], 1)
    a = (np.arange(nu)[:, None] * (nv + 1) + np.arange(nv)[None, :]).ravel()
    b, c, d = a + nv + 1, a + 1, a + nv + 2
    return p, n, uv, np.stack([a, b, c, c, b, d], 1).ravel()


def _disc(n, radius, y, up):
    """A fan disc at height y facing +y (up) or -y."""
    ang = np.linspace(0, 2 * np.pi, n + 1)[:-1]
    p = np.concatenate([[[0, y, 0]], np.stack([radius * np.cos(ang), np.full(n, y), radius * np.sin(ang)], 1)])
    nrm = np.tile([0, 1 if up else -1, 0], (n + 1, 1))
    uv = np.concatenate([[[0.5, 0.5]], np.stack([0.5 + 0.5 * np.cos(ang), 0.5 + 0.5 * np.sin(ang)], 1)])
    k = np.arange(n)
    return p, nrm, uv, np.stack([np.zeros(n, int), 1 + k, 1 + (k + 1) % n], 1).ravel()


def _merge(parts):
    bases = np.cumsum([0] + [len(p) for p, *_ in parts[:-1]])
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]), np.concatenate([p[3] + b for p, b in zip(parts, bases)]))


def _cube():
    parts = []
    for axis in range(3):
        for sign in (-1.0, 1.0):
            a, b = [k for k in range(3) if k != axis]

            def face(u, v, axis=axis, sign=sign, a=a, b=b):
                p = np.zeros((len(u), 3))
                p[:, axis], p[:, a], p[:, b] = 0.5 * sign, u - 0.5, v - 0.5
                n = np.zeros((len(u), 3))
                n[:, axis] = sign
                return p, n
            parts.append(_grid(1, 1, face))
    return _merge(parts)


def _sphere(r=0.5, nu=32, nv=16):
    def s(u, v):
        th, ph = 2 * np.pi * u, np.pi * v
        n = np.stack([np.sin(ph) * np.cos(th), np.cos(ph), np.sin(ph) * np.sin(th)], 1)
        return r * n, n
    return _grid(nu, nv, s)


def _torus(big=0.42, small=0.15, nu=40, nv=14):
    def s(u, v):
        th, ph = 2 * np.pi * u, 2 * np.pi * v
        n = np.stack([np.cos(ph) * np.cos(th), np.sin(ph), np.cos(ph) * np.sin(th)], 1)
        ring = np.stack([np.cos(th), np.zeros_like(th), np.sin(th)], 1)
        return big * ring + small * n, n
    p, n, uv, i = _grid(nu, nv, s)
    return p, n, uv * [3.0, 1.0], i


def _cylinder(r=0.3, h=1.0, nu=28):
    def side(u, v):
        th = 2 * np.pi * u
        n = np.stack([np.cos(th), np.zeros_like(th), np.sin(th)], 1)
        return r * n + np.stack([0 * u, h * v, 0 * u], 1), n
    p, n, uv, i = _grid(nu, 1, side)
    return _merge([(p, n, uv * [2.0, 1.0], i), _disc(nu, r, h, True), _disc(nu, r, 0.0, False)])


def _cone(r=0.45, h=1.0, nu=28):
    def side(u, v):
        th = 2 * np.pi * u
        n = np.stack([h * np.cos(th), np.full_like(th, r), h * np.sin(th)], 1) / math.hypot(r, h)
        ring = np.stack([np.cos(th), np.zeros_like(th), np.sin(th)], 1)
        return r * (1 - v)[:, None] * ring + np.stack([0 * u, h * v, 0 * u], 1), n
    return _merge([_grid(nu, 1, side), _disc(nu, r, 0.0, False)])


def _ground():
    def s(u, v):
        p = np.stack([(2 * u - 1) * GROUND_HALF, 0 * u, (2 * v - 1) * GROUND_HALF], 1)
        return p, np.tile([0.0, 1.0, 0.0], (len(u), 1))
    return _grid(1, 1, s)


MESHES = {"ground": _ground, "crate": _cube, "ball": _sphere, "ring": _torus, "pillar": _cylinder, "cone": _cone}


# ----------------------------------------------------------------------------- maths

def _rot_y(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def _rot_x(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def _rot_z(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def look_at(eye, target, up=(0.0, 1.0, 0.0)) -> np.ndarray:
    """A right-handed view matrix (camera looks down -z), column-vector convention."""
    eye, target = np.asarray(eye, float), np.asarray(target, float)
    f = target - eye
    f /= np.linalg.norm(f)
    r = np.cross(f, up)
    r /= np.linalg.norm(r)
    u = np.cross(r, f)
    m = np.eye(4)
    m[0, :3], m[1, :3], m[2, :3] = r, u, -f
    m[:3, 3] = -m[:3, :3] @ eye
    return m


def perspective(fovy_deg: float, aspect: float, near: float = _Z_NEAR, far: float = _Z_FAR) -> np.ndarray:
    """WebGPU clip space (depth 0..1)."""
    f = 1.0 / math.tan(math.radians(fovy_deg) / 2)
    return np.array([[f / aspect, 0, 0, 0], [0, f, 0, 0],
                     [0, 0, far / (near - far), near * far / (near - far)], [0, 0, -1, 0]])


# ----------------------------------------------------------------------------- the scene

class Scene:
    """Meshes, textures and pipelines on `device`; per-eye colour / ID / depth targets.

    render() records into the caller's encoder; each call takes the next of RING_SLOTS
    uniform slots, so at most RING_SLOTS render() calls may go into one submission.
    """

    COLOR_FORMAT, ID_FORMAT, DEPTH_FORMAT = "rgba8unorm", "r32uint", "depth24plus"

    def __init__(self, device, width: int, height: int, seed: int = 0, stereo: bool = False,
                 ipd: float = 0.064, fovy: float = 60.0, texture_size: int = 128):
        self.device, self.stereo, self.ipd, self.fovy = device, bool(stereo), float(ipd), float(fovy)
        self._slot = 0
        self._make_meshes()
        self._make_textures(texture_size)
        self._make_pipelines()
        self.reseed(seed)
        self.resize(width, height)

    # -- set-up
    def _make_meshes(self):
        verts, idx, self._draws = [], [], {}
        nv = ni = 0
        for name, make in MESHES.items():
            p, n, uv, i = make()
            verts.append(np.concatenate([p, n, uv], 1).astype(np.float32))
            idx.append(i.astype(np.uint32))
            self._draws[name] = (len(i), ni, nv)  # index count, first index, base vertex
            nv, ni = nv + len(p), ni + len(i)
        usage = wgpu.BufferUsage
        self._vertices = self.device.create_buffer_with_data(
            data=np.concatenate(verts).tobytes(), usage=usage.VERTEX, label="scene vertices")
        self._indices = self.device.create_buffer_with_data(
            data=np.concatenate(idx).tobytes(), usage=usage.INDEX, label="scene indices")
        self._n_inst = 1 + INSTANCES_PER_CLASS * (len(MESHES) - 1)
        self._inst_bytes = self._n_inst * _INST_FLOATS * 4
        self._instances = self.device.create_buffer(
            size=RING_SLOTS * self._inst_bytes, usage=usage.VERTEX | usage.COPY_DST, label="scene instances")
        self._frame = self.device.create_buffer(
            size=RING_SLOTS * _FRAME_BYTES, usage=usage.UNIFORM | usage.COPY_DST, label="scene frame uniforms")

    def _make_textures(self, size):
        if size & (size - 1):
            raise ValueError(f"texture_size must be a power of two, not {size}")
        levels = _mip_chain(class_textures(size))
        tex = self.device.create_texture(
            size=(size, size, len(CLASSES)), format="rgba8unorm-srgb", mip_level_count=len(levels),
            usage=wgpu.TextureUsage.TEXTURE_BINDING | wgpu.TextureUsage.COPY_DST, label="scene albedo")
        for level, img in enumerate(levels):
            s = img.shape[1]
            self.device.queue.write_texture({"texture": tex, "mip_level": level, "origin": (0, 0, 0)},
                                            np.ascontiguousarray(img), {"bytes_per_row": 4 * s, "rows_per_image": s},
                                            (s, s, len(CLASSES)))
        self.albedo = tex
        self._sampler = self.device.create_sampler(
            address_mode_u="repeat", address_mode_v="repeat", mag_filter="linear", min_filter="linear",
            mipmap_filter="linear")  # anisotropy 4 made frames 5x slower on lavapipe

    def _make_pipelines(self):
        dev, stage = self.device, wgpu.ShaderStage
        module = dev.create_shader_module(code=(SHADERS / "scene.wgsl").read_text(), label="scene.wgsl")
        self._layout = layout = dev.create_bind_group_layout(entries=[
            {"binding": 0, "visibility": stage.VERTEX | stage.FRAGMENT,
             "buffer": {"type": "uniform", "has_dynamic_offset": True, "min_binding_size": _FRAME_BYTES}},
            {"binding": 1, "visibility": stage.FRAGMENT, "texture": {"sample_type": "float", "view_dimension": "2d-array"}},
            {"binding": 2, "visibility": stage.FRAGMENT, "sampler": {"type": "filtering"}}])
        self._group = dev.create_bind_group(layout=layout, entries=[
            {"binding": 0, "resource": {"buffer": self._frame, "offset": 0, "size": _FRAME_BYTES}},
            {"binding": 1, "resource": self.albedo.create_view(dimension="2d-array")},
            {"binding": 2, "resource": self._sampler}])
        pl = dev.create_pipeline_layout(bind_group_layouts=[layout])
        targets = [{"format": self.COLOR_FORMAT}, {"format": self.ID_FORMAT}]
        f4 = "float32x4"
        inst_attrs = [{"shader_location": 3 + k, "offset": 16 * k, "format": f4} for k in range(4)]
        inst_attrs += [{"shader_location": 7 + k, "offset": 64 + 16 * k, "format": "float32x3"} for k in range(3)]
        inst_attrs += [{"shader_location": 10, "offset": 112, "format": f4},
                       {"shader_location": 11, "offset": 128, "format": "uint32"}]
        self._object_pipeline = dev.create_render_pipeline(
            label="scene objects", layout=pl,
            vertex={"module": module, "entry_point": "vs_object", "buffers": [
                {"array_stride": 32, "step_mode": "vertex", "attributes": [
                    {"shader_location": 0, "offset": 0, "format": "float32x3"},
                    {"shader_location": 1, "offset": 12, "format": "float32x3"},
                    {"shader_location": 2, "offset": 24, "format": "float32x2"}]},
                {"array_stride": _INST_FLOATS * 4, "step_mode": "instance", "attributes": inst_attrs}]},
            primitive={"topology": "triangle-list", "cull_mode": "none"},
            depth_stencil={"format": self.DEPTH_FORMAT, "depth_write_enabled": True, "depth_compare": "less"},
            fragment={"module": module, "entry_point": "fs_object", "targets": targets})
        self._sky_pipeline = dev.create_render_pipeline(
            label="scene sky", layout=pl, vertex={"module": module, "entry_point": "vs_sky"},
            primitive={"topology": "triangle-list"},
            depth_stencil={"format": self.DEPTH_FORMAT, "depth_write_enabled": False, "depth_compare": "always"},
            fragment={"module": module, "entry_point": "fs_sky", "targets": targets})

    def resize(self, width: int, height: int) -> None:
        """New targets of width x height (old ones are dropped, never destroyed: work may be pending)."""
        if width < 1 or height < 1:
            raise ValueError(f"bad size {width}x{height}")
        self.width, self.height = int(width), int(height)
        usage = wgpu.TextureUsage
        self.targets = []
        for eye in range(2 if self.stereo else 1):
            def make(fmt, use, what, eye=eye):
                return self.device.create_texture(size=(self.width, self.height, 1), format=fmt, usage=use,
                                                  label=f"scene {what} eye {eye}")
            colour = make(self.COLOR_FORMAT, usage.RENDER_ATTACHMENT | usage.TEXTURE_BINDING | usage.COPY_SRC, "colour")
            ids = make(self.ID_FORMAT, usage.RENDER_ATTACHMENT | usage.TEXTURE_BINDING | usage.COPY_SRC, "ids")
            depth = make(self.DEPTH_FORMAT, usage.RENDER_ATTACHMENT, "depth")
            self.targets.append((colour, ids, depth, colour.create_view(), ids.create_view(), depth.create_view()))

    def reseed(self, seed: int) -> None:
        """Choose the object layout, motions, camera path and sun for `seed` (CPU only)."""
        self.seed = int(seed)
        rng = np.random.default_rng([self.seed, 4242])
        self._objects = []  # (class index, mesh name, base xz, scale, motion params)
        placed = []
        for name in MESHES:
            if name == "ground":
                continue
            for _ in range(INSTANCES_PER_CLASS):
                for _attempt in range(100):
                    r, a = math.sqrt(rng.uniform(0.8 ** 2, 5.0 ** 2)), rng.uniform(0, 2 * np.pi)
                    xz = np.array([r * math.cos(a), r * math.sin(a)])
                    if all(np.linalg.norm(xz - q) > 1.8 for q in placed):
                        break
                placed.append(xz)
                # objects large enough to cover several patches at the demo's resolutions
                self._objects.append((CLASSES.index(name), name, xz, rng.uniform(1.0, 1.5),
                                      rng.uniform(-1, 1, size=6)))
        self._camera = {
            "phase": rng.uniform(0, 2 * np.pi), "speed": rng.choice([-1, 1]) * rng.uniform(0.12, 0.3),
            "radius": rng.uniform(6.5, 8.5), "height": rng.uniform(1.3, 3.0), "wobble": rng.uniform(0, 2 * np.pi, 4)}
        az, el = rng.uniform(0, 2 * np.pi), rng.uniform(math.radians(30), math.radians(65))
        sun = np.array([math.cos(el) * math.cos(az), math.sin(el), math.cos(el) * math.sin(az)])
        warm = rng.uniform(0, 1)
        self._light = {
            "sun": sun, "sun_color": np.array([1.0, 0.93 - 0.08 * warm, 0.82 - 0.15 * warm]) * rng.uniform(1.6, 2.2),
            "ambient": rng.uniform(0.55, 0.75), "zenith": np.array([0.16, 0.32, 0.75]) * rng.uniform(0.8, 1.1),
            "horizon": np.array([0.68, 0.78, 0.9]), "bounce": np.array([0.22, 0.25, 0.12]), "fog": rng.uniform(0.005, 0.01)}

    # -- per-frame state (numpy, CPU)
    def camera(self, t: float, eye: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(view, projection) 4x4 matrices for time t and eye (0: left, 1: right when stereo)."""
        c, w = self._camera, self._camera["wobble"]
        a = c["phase"] + c["speed"] * t
        r = c["radius"] + 0.8 * math.sin(0.31 * t + w[0])
        pos = np.array([r * math.cos(a), c["height"] + 0.3 * math.sin(0.23 * t + w[1]), r * math.sin(a)])
        target = np.array([0.8 * math.sin(0.17 * t + w[2]), 0.6, 0.8 * math.cos(0.13 * t + w[3])])
        if self.stereo:
            fwd = (target - pos) / np.linalg.norm(target - pos)
            right = np.cross(fwd, [0.0, 1.0, 0.0])
            shift = (eye - 0.5) * self.ipd * right / np.linalg.norm(right)
            pos, target = pos + shift, target + shift  # parallel eyes, as an XR host renders them
        return look_at(pos, target), perspective(self.fovy, self.width / self.height)

    def instances(self, t: float) -> np.ndarray:
        """[n, _INST_FLOATS] float32 instance records for time t (ground first, then by class)."""
        out = np.zeros((self._n_inst, _INST_FLOATS), np.float32)
        rows = [(CLASSES.index("ground"), np.eye(3), np.zeros(3), 1.0)]
        for cls, name, xz, s, m in self._objects:
            ph, sp = np.pi * m[0], 0.6 + 0.4 * m[1]
            x, z = xz
            if name == "crate":
                rot, pos, scale = _rot_y(ph + 0.5 * sp * t), [x, 0.5 * s + 0.15 * s * max(0.0, math.sin(1.3 * t + ph)) ** 8, z], s
            elif name == "ball":
                orbit = 0.4 + 0.3 * m[2]
                ang = ph + sp * t
                dx, dz = orbit * math.cos(ang), orbit * math.sin(ang)
                rot, scale = _rot_y(-ang) @ _rot_z(-ang * orbit / (0.5 * s)), s
                pos = [x + dx, 0.5 * s + 0.6 * abs(math.sin(2.0 * sp * t + ph)), z + dz]
            elif name == "ring":
                rot, scale = _rot_y(ph + 0.8 * sp * t) @ _rot_x(np.pi / 2 + 0.3 * math.sin(t + ph)), s
                pos = [x, 0.75 * s + 0.25 + 0.2 * math.sin(1.1 * t + ph), z]
            elif name == "pillar":
                h = 1.4 + 0.8 * m[2]
                rot, scale, pos = _rot_y(ph + 0.2 * sp * t), np.array([s, h * s, s]), [x, 0.0, z]
            else:  # cone
                ang = ph + 0.35 * sp * t
                rot, scale = _rot_y(2 * ang) @ _rot_x(0.12 * math.sin(1.7 * t + ph)), s * (1.0 + 0.2 * m[3])
                pos = [x + 0.5 * math.cos(ang), 0.0, z + 0.5 * math.sin(ang)]
            rows.append((cls, rot, np.asarray(pos, float), scale))
        for k, (cls, rot, pos, scale) in enumerate(rows):
            lin = rot * np.broadcast_to(np.asarray(scale, float), (3,))[None, :]  # rot @ diag(scale)
            model = np.eye(4)
            model[:3, :3], model[:3, 3] = lin, pos
            normal = np.linalg.inv(lin).T
            out[k, 0:16] = model.T.ravel()
            for j in range(3):
                out[k, 16 + 4 * j:19 + 4 * j] = normal[:, j]
            ground = cls == CLASSES.index("ground")
            out[k, 28:31] = (2 * GROUND_HALF / 1.5,) * 2 + (0.05,) if ground else (1.0, 1.0, 0.35)
            out[k, 32:33].view(np.uint32)[0] = cls
        return out

    def frame_uniforms(self, t: float, eye: int = 0) -> np.ndarray:
        view, proj = self.camera(t, eye)
        vp = proj @ view
        eye_pos = np.linalg.inv(view)[:3, 3]
        L = self._light
        u = np.zeros(_FRAME_BYTES // 4, np.float32)
        u[0:16], u[16:32] = vp.T.ravel(), np.linalg.inv(vp).T.ravel()
        u[32:35] = eye_pos
        u[36:39] = L["sun"]
        u[40:43], u[43] = L["sun_color"], L["ambient"]
        u[44:47], u[47] = L["zenith"], L["fog"]
        u[48:51] = L["horizon"]
        u[52:55] = L["bounce"]
        return u

    # -- rendering
    def render(self, encoder, t: float, eye: int = 0, timestamp_writes=None):
        """Record the render pass for time t and eye into `encoder`; return (colour, id) textures."""
        if not 0 <= eye < len(self.targets):
            raise ValueError(f"eye {eye}: this scene has {len(self.targets)} eye(s) (stereo={self.stereo})")
        slot, self._slot = self._slot, (self._slot + 1) % RING_SLOTS
        q = self.device.queue
        q.write_buffer(self._frame, slot * _FRAME_BYTES, self.frame_uniforms(t, eye).tobytes())
        q.write_buffer(self._instances, slot * self._inst_bytes, self.instances(t).tobytes())
        colour, ids, _, cview, iview, dview = self.targets[eye]
        rp = encoder.begin_render_pass(label=f"scene eye {eye}", color_attachments=[
            {"view": cview, "load_op": "clear", "store_op": "store", "clear_value": (0, 0, 0, 1)},
            {"view": iview, "load_op": "clear", "store_op": "store", "clear_value": (0, 0, 0, 0)}],
            depth_stencil_attachment={"view": dview, "depth_load_op": "clear", "depth_store_op": "discard",
                                      "depth_clear_value": 1.0},
            **({"timestamp_writes": timestamp_writes} if timestamp_writes else {}))
        rp.set_bind_group(0, self._group, [slot * _FRAME_BYTES])
        rp.set_pipeline(self._sky_pipeline)
        rp.draw(3)
        rp.set_pipeline(self._object_pipeline)
        rp.set_vertex_buffer(0, self._vertices)
        rp.set_vertex_buffer(1, self._instances, slot * self._inst_bytes, self._inst_bytes)
        rp.set_index_buffer(self._indices, "uint32")
        first = 0
        for name, (count, first_index, base_vertex) in self._draws.items():
            n = 1 if name == "ground" else INSTANCES_PER_CLASS
            rp.draw_indexed(count, n, first_index, base_vertex, first)
            first += n
        rp.end()
        return colour, ids

    def read_frame(self, t: float, eye: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Render and read back: (rgb uint8 [H, W, 3], class ids uint8 [H, W]). Waits for the GPU."""
        encoder = self.device.create_command_encoder(label="scene read_frame")
        self.render(encoder, t, eye)
        self.device.queue.submit([encoder.finish()])
        return self.read_targets(eye)

    def read_targets(self, eye: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Read the current contents of an eye's targets (after the work that wrote them was submitted)."""
        colour, ids = self.targets[eye][:2]
        w, h = self.width, self.height
        q = self.device.queue
        rgba = np.frombuffer(q.read_texture({"texture": colour, "mip_level": 0, "origin": (0, 0, 0)},
                                            {"offset": 0, "bytes_per_row": 4 * w, "rows_per_image": h}, (w, h, 1)),
                             np.uint8).reshape(h, w, 4)
        lab = np.frombuffer(q.read_texture({"texture": ids, "mip_level": 0, "origin": (0, 0, 0)},
                                           {"offset": 0, "bytes_per_row": 4 * w, "rows_per_image": h}, (w, h, 1)),
                            np.uint32).reshape(h, w)
        return rgba[..., :3].copy(), lab.astype(np.uint8)

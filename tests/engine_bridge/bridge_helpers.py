"""Helpers for the engine-bridge tests: tiny models, CPU reads of GPU state, example runs."""
import os
import subprocess
import sys

import numpy as np
from meganeura.compiler import Builder, compile_model
from meganeura.runtime import Package


def pixel_model(h=32, w=32, classes=4, hidden=8, seed=0, channels=3):
    """Per-pixel 'segmentation': x [h*w, channels] -> linear -> relu -> linear -> logits [h*w, classes]."""
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.input("x", (h * w, channels))
    hid = b.relu(b.linear(x, b.param("fc1.weight", rng.standard_normal((hidden, channels))),
                          b.param("fc1.bias", rng.standard_normal(hidden) * 0.1)))
    b.output("logits", b.linear(hid, b.param("fc2.weight", rng.standard_normal((classes, hidden))),
                                b.param("fc2.bias", rng.standard_normal(classes) * 0.1)))
    return b.build()


def identity_package(shape):
    """A model whose output `y` is its input `x` (x * 1): to inspect texture kernels."""
    b = Builder()
    b.output("y", b.input("x", shape) * 1.0)
    return Package.from_bytes(compile_model(b.build()))


def read_buffer(session, tensor):
    """A tensor's (a runtime records.TensorInfo) current value, read on the CPU (tests only: this
    waits for the GPU)."""
    n = tensor.count
    data = session.device.queue.read_buffer(session.buffers[tensor.buffer], 0, -(-n * 4 // 4) * 4)
    return np.frombuffer(data, np.float32)[:n].reshape(tensor.shape).copy()


def read_rgba8(device, texture):
    """queue.read_texture of an 8-bit RGBA/BGRA texture -> H x W x 4 uint8, RGBA order."""
    w, h = texture.width, texture.height
    row = -(-w * 4 // 256) * 256
    data = device.queue.read_texture({"texture": texture, "mip_level": 0, "origin": (0, 0, 0)},
                                     {"offset": 0, "bytes_per_row": row, "rows_per_image": h}, (w, h, 1))
    img = np.frombuffer(data, np.uint8).reshape(h, row)[:, :w * 4].reshape(h, w, 4)
    return img[..., [2, 1, 0, 3]] if texture.format.startswith("bgra") else img.copy()


def upload_texture(device, image, format="rgba8unorm"):
    """A sampleable texture holding `image` (H x W x 4; uint8, float16 or float32 by format)."""
    import wgpu

    h, w = image.shape[:2]
    tex = device.create_texture(size=(w, h, 1), format=format,
                                usage=wgpu.TextureUsage.TEXTURE_BINDING | wgpu.TextureUsage.COPY_DST
                                | wgpu.TextureUsage.COPY_SRC)
    data = image[..., [2, 1, 0, 3]] if format.startswith("bgra") else image
    data = np.ascontiguousarray(data)
    device.queue.write_texture({"texture": tex, "mip_level": 0, "origin": (0, 0, 0)}, data,
                               {"offset": 0, "bytes_per_row": w * data.itemsize * 4, "rows_per_image": h},
                               (w, h, 1))
    return tex


def run_example(name, *args, timeout=120):
    """Run examples/NAME with this interpreter; returns its stdout (fails on a non-zero exit)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, os.path.join(root, "examples", name), *args], check=False, capture_output=True,
                          text=True, timeout=timeout, cwd=root)
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


def handover_package():
    """'infer': x -> frozen backbone -> features, cached in a state -> head -> logits;
    'train_head': the cached features -> head -> cross-entropy -> AdamW on the head."""
    from meganeura.compiler import TrainConfig
    from meganeura.compiler.ir.builder import Tensor
    from meganeura.compiler.compile import compile_programs
    from meganeura.compiler.ir.training import attach_optimizer

    rng = np.random.default_rng(0)
    w_back, w_head = rng.standard_normal((6, 5)) * 0.5, rng.standard_normal((3, 6)) * 0.5
    b = Builder()
    feats = b.tanh(b.matmul(b.input("x", (4, 5)), b.param("backbone.weight", w_back, frozen=True), trans_b=True))
    b.e.leaf("state", "cache.features", (4, 6))
    b.g.assigns["cache.features"] = feats.id
    b.output("logits", b.linear(feats, b.param("head.weight", w_head)))
    t = Builder()
    logits = t.linear(Tensor(t, t.e.leaf("state", "cache.features", (4, 6))), t.param("head.weight", w_head))
    loss = t.cross_entropy(logits, t.input("labels", (4,), "i32"), t.input("mask", (4,)))
    t.output("loss", loss)
    train = attach_optimizer(t.g, loss.id, TrainConfig(optimizer="adamw", lr=0.05))
    return Package.from_bytes(compile_programs({"infer": b.g, "train_head": train}))

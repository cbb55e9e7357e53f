"""The DINOv2 builder against transformers' Dinov2Model (random initialisation, float64
reference): forward with interpolated (non-square) position embeddings, one training
step, the 224x224 acceptance check through a safetensors file, and a compile of ViT-S/14."""
import time

import numpy as np
import torch
import transformers
from harness import check_forward, check_training_step, state_dict_numpy
from meganeura.compiler import compile_model
from meganeura.compiler.models.dinov2 import dinov2, dinov2_vits14_config
from meganeura.compiler.ir.training import TrainConfig
from safetensors.numpy import load_file
from safetensors.torch import save_file


def reference(seed=0, **config):
    """A randomly initialised Dinov2Model whose biases, norms and layer scales are not trivial."""
    torch.manual_seed(seed)
    cfg = transformers.Dinov2Config(**config)
    m = transformers.Dinov2Model(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return cfg, m


def test_dinov2_interpolated_positions_forward_and_training_step(device):
    # a 4x4 position grid (56 / 14) resized bicubically to the 2x3 grid of a 28x42 input
    cfg, ref = reference(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=56, patch_size=14,
                         layerscale_value=0.5)
    model = dinov2(cfg, batch=2, height=28, width=42, weights=state_dict_numpy(ref), pooler=True)
    x = np.random.default_rng(0).standard_normal((2, 3, 28, 42))
    errors = check_forward(model, lambda pixel_values: ref.double()(pixel_values).last_hidden_state,
                           {"pixel_values": x}, device, output="last_hidden_state")
    print("forward", errors)
    labels = np.random.default_rng(1).standard_normal((2, 7, 32))
    # a key bias adds the same q.b to every score of a row: softmax cancels it, so its
    # gradient is exactly zero and a relative comparison would compare rounding noise
    model.graph.frozen.update(n for n in model.params if n.endswith("k_proj.bias"))
    errors = check_training_step(
        model, ref, lambda m, ins, y: torch.nn.functional.mse_loss(m(ins["pixel_values"]).last_hidden_state, y),
        {"pixel_values": x}, labels, device, output="last_hidden_state")
    print("training step, worst (interpreter, gpu):", tuple(max(v[j] for v in errors.values()) for j in (0, 1)))


def test_dinov2_matches_transformers_at_224_from_safetensors(device, tmp_path):
    # the ViT-S/14 position grid (37x37, from 518) interpolated to 16x16, at a tiny width
    cfg, ref = reference(seed=1, hidden_size=24, num_hidden_layers=2, num_attention_heads=2, image_size=518,
                         patch_size=14)
    path = tmp_path / "dinov2.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    weights = load_file(str(path))
    model = dinov2(cfg, batch=1, height=224, width=224, weights=weights)
    assert set(model.params) == set(weights) - {"embeddings.mask_token"}
    x = np.random.default_rng(2).standard_normal((1, 3, 224, 224))
    errors = check_forward(model, lambda pixel_values: ref.double()(pixel_values).last_hidden_state,
                           {"pixel_values": x}, device)
    print("224x224", errors)


def test_dinov2_vits14_compiles():
    t0 = time.perf_counter()
    model = dinov2(dinov2_vits14_config(), batch=1, height=224, width=224)
    t1 = time.perf_counter()
    package = compile_model(model, TrainConfig(loss="mse", optimizer="adamw"))
    t2 = time.perf_counter()
    n = sum(v.size for v in model.params.values())
    print(f"ViT-S/14 224x224: {n / 1e6:.1f} M params, build {t1 - t0:.2f} s, compile {t2 - t1:.2f} s, "
          f"package {len(package) / 2**20:.0f} MiB")
    assert 21e6 < n < 23e6

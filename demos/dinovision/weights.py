"""Real DINOv2 weights for the backbone (`--weights`): a transformers-layout state dict
(`Dinov2Model.save_pretrained` / safetensors) with its architecture read off the tensors."""
from __future__ import annotations

import re

import numpy as np

from meganeura.compiler.models.dinov2 import Dinov2Config


def dinov2_config_from_weights(w: dict) -> Dinov2Config:
    """The Dinov2Config that these tensors fit (ViT-S/B/L/g, patch size, layers, SwiGLU)."""
    w = {k.removeprefix("dinov2."): v for k, v in w.items()}
    try:
        proj = w["embeddings.patch_embeddings.projection.weight"]
        pos = w["embeddings.position_embeddings"]
    except KeyError as exc:
        raise ValueError(f"not DINOv2 weights in the transformers layout: no {exc.args[0]}") from None
    d, p = int(proj.shape[0]), int(proj.shape[2])
    layers = 1 + max(int(m.group(1)) for k in w if (m := re.match(r"encoder\.layer\.(\d+)\.", k)))
    grid = int(round(np.sqrt(pos.shape[1] - 1)))
    swiglu = any(".mlp.weights_in." in k or ".mlp.gate_proj." in k for k in w)
    fc1 = w.get("encoder.layer.0.mlp.fc1.weight")
    ratio = fc1.shape[0] / d if fc1 is not None else 4.0
    return Dinov2Config(hidden_size=d, num_hidden_layers=layers, num_attention_heads=max(1, d // 64),
                        mlp_ratio=float(ratio), patch_size=p, image_size=grid * p, use_swiglu_ffn=swiglu,
                        layerscale_value=1.0)

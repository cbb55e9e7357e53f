"""DINOv2 vision transformer, as transformers' `Dinov2Model`: patch embedding, CLS
token, position embeddings interpolated bicubically to the input's patch grid,
pre-norm blocks with layer scale, final layer norm.

Parameter names are those of `Dinov2Model.state_dict()`; checkpoints in the older
layout (`attention.attention.query`, `attention.output.dense`, ...) load too.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.builder import Builder, Model
from . import config_from, param_source


@dataclass
class Dinov2Config:
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    mlp_ratio: float = 4.0
    patch_size: int = 14
    image_size: int = 518
    num_channels: int = 3
    layer_norm_eps: float = 1e-6
    layerscale_value: float = 1.0
    qkv_bias: bool = True
    hidden_act: str = "gelu"
    use_swiglu_ffn: bool = False
    initializer_range: float = 0.02

    @classmethod
    def of(cls, config) -> Dinov2Config:
        """From this dataclass, a dict, or a transformers `Dinov2Config` (attributes)."""
        return config_from(cls, config)


def dinov2_vits14_config() -> Dinov2Config:
    """ViT-S/14 (facebook/dinov2-small): 37x37 position grid from 518x518 pre-training."""
    return Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, mlp_ratio=4.0,
                        patch_size=14, image_size=518, layerscale_value=1.0)


# transformers' own renaming of the older checkpoint layout (conversion_mapping.py)
_LEGACY = (("attention.attention.query", "attention.q_proj"), ("attention.attention.key", "attention.k_proj"),
           ("attention.attention.value", "attention.v_proj"), ("attention.output.dense", "attention.o_proj"))

_GELU = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}


def _renamed(weights: dict | None) -> dict:
    out = {}
    for k, v in (weights or {}).items():
        for old, new in _LEGACY:
            k = k.replace(old, new)
        out[k] = v
    return out


def dinov2(config, batch: int = 1, height: int = 224, width: int = 224, weights: dict | None = None,
           seed: int = 0, pooler: bool = False) -> Model:
    """Input "pixel_values" [batch, channels, height, width]; output "last_hidden_state"
    [batch, 1 + patches, hidden] (and "pooler_output" [batch, hidden], the CLS token,
    with `pooler`). Parameters missing from `weights` are initialised as transformers does."""
    cfg = Dinov2Config.of(config)
    rng = np.random.default_rng(seed)
    weights = _renamed(weights)
    b = Builder()
    std = cfg.initializer_range

    param = param_source(b, weights)

    normal = lambda s: rng.standard_normal(s) * std
    zeros, ones = np.zeros, np.ones

    def linear(x, name, n_in, n_out, bias=True):
        w = param(f"{name}.weight", (n_out, n_in), normal)
        return b.linear(x, w, param(f"{name}.bias", (n_out,), zeros) if bias else None)

    def layer_norm(x, name):
        d = cfg.hidden_size
        return b.layer_norm(x, param(f"{name}.weight", (d,), ones), param(f"{name}.bias", (d,), zeros),
                            eps=cfg.layer_norm_eps)

    d, p, heads = cfg.hidden_size, cfg.patch_size, cfg.num_attention_heads
    dh = d // heads
    gh, gw = height // p, width // p
    n = gh * gw
    tokens = 1 + n
    rows = batch * tokens

    # embeddings: a stride-p convolution, CLS token, position embeddings
    x = b.input("pixel_values", (batch, cfg.num_channels, height, width))
    pw = param("embeddings.patch_embeddings.projection.weight", (d, cfg.num_channels, p, p), normal)
    pb = param("embeddings.patch_embeddings.projection.bias", (d,), zeros)
    patches = b.conv2d(x, pw, stride=(p, p), padding=(0, 0, 0, 0)) + b.reshape(pb, (1, d, 1, 1))
    patches = b.transpose(b.reshape(patches, (batch, d, n)), (0, 2, 1))
    cls = param("embeddings.cls_token", (1, 1, d), normal)
    h = b.concat(b.broadcast_to(cls, shape=(batch, 1, d)), patches, axis=1)
    grid = cfg.image_size // p
    pos = param("embeddings.position_embeddings", (1, grid * grid + 1, d), normal)
    h = h + _interpolate_pos_encoding(b, pos, grid, gh, gw, height == width)
    h = b.reshape(h, (rows, d))

    for i in range(cfg.num_hidden_layers):
        pre = f"encoder.layer.{i}"
        a = layer_norm(h, f"{pre}.norm1")
        q, k, v = (b.transpose(b.reshape(linear(a, f"{pre}.attention.{t}_proj", d, d, cfg.qkv_bias),
                                         (batch, tokens, heads, dh)), (0, 2, 1, 3)) for t in "qkv")
        a = b.reshape(b.transpose(b.attention(q, k, v), (0, 2, 1, 3)), (rows, d))
        a = linear(a, f"{pre}.attention.o_proj", d, d)
        h = h + a * param(f"{pre}.layer_scale1.lambda1", (d,), lambda s: np.full(s, cfg.layerscale_value))
        m = layer_norm(h, f"{pre}.norm2")
        if cfg.use_swiglu_ffn:
            f = (int(int(d * cfg.mlp_ratio) * 2 / 3) + 7) // 8 * 8
            m = b.swiglu(linear(m, f"{pre}.mlp.gate_proj", d, f), linear(m, f"{pre}.mlp.up_proj", d, f))
            m = linear(m, f"{pre}.mlp.down_proj", f, d)
        else:
            f = int(d * cfg.mlp_ratio)
            m = b.gelu(linear(m, f"{pre}.mlp.fc1", d, f), approximate=_GELU[cfg.hidden_act])
            m = linear(m, f"{pre}.mlp.fc2", f, d)
        h = h + m * param(f"{pre}.layer_scale2.lambda1", (d,), lambda s: np.full(s, cfg.layerscale_value))

    out = b.reshape(layer_norm(h, "layernorm"), (batch, tokens, d))
    b.output("last_hidden_state", out)
    if pooler:
        b.output("pooler_output", b.reshape(b.slice(out, starts=(0, 0, 0), steps=(1, 1, 1), shape=(batch, 1, d)),
                                            (batch, d)))
    return b.build()


def _interpolate_pos_encoding(b: Builder, pos, grid: int, gh: int, gw: int, square_input: bool):
    """`Dinov2Embeddings.interpolate_pos_encoding`: the [grid, grid] table of patch
    positions resized bicubically (align_corners=False) to [gh, gw]; the CLS position
    stays. No interpolation when the patch count already matches and height == width."""
    d = pos.shape[-1]
    if gh * gw == grid * grid and square_input:
        return pos
    cls = b.slice(pos, starts=(0, 0, 0), steps=(1, 1, 1), shape=(1, 1, d))
    table = b.slice(pos, starts=(0, 1, 0), steps=(1, 1, 1), shape=(1, grid * grid, d))
    table = b.transpose(b.reshape(table, (1, grid, grid, d)), (0, 3, 1, 2))
    # torch's bicubic source index is scale * (o + 0.5) - 0.5 with no special case
    table = b.resize(table, size=(gh, gw), mode="cubic", transform="half_pixel", cubic_a=-0.75)
    table = b.reshape(b.transpose(table, (0, 2, 3, 1)), (1, gh * gw, d))
    return b.concat(cls, table, axis=1)

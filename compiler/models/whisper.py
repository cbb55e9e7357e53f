"""The Whisper audio encoder, as transformers' `WhisperEncoder` (`WhisperModel.encoder`):
two 1-D convolutions with GELU (the second halves the frame rate), fixed sinusoidal
position embeddings, pre-norm transformer blocks, final layer norm.

Parameter names are those of `WhisperEncoder.state_dict()`; a state_dict of a whole
`WhisperModel` ("encoder." prefix) or `WhisperForConditionalGeneration`
("model.encoder.") loads too, and the parameters then keep that prefix.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.builder import Builder, Model
from . import config_from, param_source


@dataclass
class WhisperEncoderConfig:
    d_model: int = 384
    encoder_layers: int = 4
    encoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    num_mel_bins: int = 80
    max_source_positions: int = 1500
    activation_function: str = "gelu"
    init_std: float = 0.02

    @classmethod
    def of(cls, config) -> WhisperEncoderConfig:
        """From this dataclass, a dict, or a transformers `WhisperConfig` (attributes)."""
        return config_from(cls, config)


def whisper_tiny_encoder_config() -> WhisperEncoderConfig:
    """openai/whisper-tiny's encoder: 80 mel bins x 3000 frames (30 s) -> 1500 positions."""
    return WhisperEncoderConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
                                num_mel_bins=80, max_source_positions=1500)


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
    """Whisper's position table: sin of every frequency, then cos."""
    inc = math.log(max_timescale) / (channels // 2 - 1)
    inv = np.exp(-inc * np.arange(channels // 2, dtype=np.float32)).astype(np.float32)
    t = np.arange(length, dtype=np.float32)[:, None] * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1)


_GELU = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}


def whisper_encoder(config, batch: int = 1, frames: int | None = None, weights: dict | None = None,
                    seed: int = 0, prefix: str | None = None) -> Model:
    """Input "input_features" [batch, num_mel_bins, frames] (default frames: 2 x
    max_source_positions, what transformers requires); output "last_hidden_state"
    [batch, (frames + 1) // 2, d_model]. The position table is a frozen parameter, as in
    transformers. Parameters missing from `weights` are initialised as transformers does."""
    cfg = WhisperEncoderConfig.of(config)
    rng = np.random.default_rng(seed)
    weights = weights or {}
    if prefix is None:
        prefix = next((p for p in ("model.encoder.", "encoder.") if f"{p}conv1.weight" in weights), "")
    b = Builder()

    param = param_source(b, weights, prefix)

    normal = lambda s: rng.standard_normal(s, dtype=np.float32) * cfg.init_std
    act = _GELU[cfg.activation_function]

    def linear(x, name, n_in, n_out, bias=True):
        w = param(f"{name}.weight", (n_out, n_in), normal)
        return b.linear(x, w, param(f"{name}.bias", (n_out,), np.zeros) if bias else None)

    def layer_norm(x, name):
        return b.layer_norm(x, param(f"{name}.weight", (d,), np.ones), param(f"{name}.bias", (d,), np.zeros),
                            eps=1e-5)

    def conv1d(x, name, c_in, stride):  # x [batch, c_in, 1, frames]: a conv2d over one row
        w = b.reshape(param(f"{name}.weight", (d, c_in, 3), normal), (d, c_in, 1, 3))
        y = b.conv2d(x, w, stride=(1, stride), padding=(0, 1, 0, 1))
        return b.gelu(y + b.reshape(param(f"{name}.bias", (d,), np.zeros), (1, d, 1, 1)), approximate=act)

    d, heads, f = cfg.d_model, cfg.encoder_attention_heads, cfg.encoder_ffn_dim
    dh = d // heads
    frames = frames or 2 * cfg.max_source_positions
    t = (frames - 1) // 2 + 1
    if t > cfg.max_source_positions:
        raise ValueError(f"{frames} frames make {t} positions; the model has {cfg.max_source_positions}")
    rows = batch * t

    x = b.input("input_features", (batch, cfg.num_mel_bins, frames))
    x = conv1d(b.reshape(x, (batch, cfg.num_mel_bins, 1, frames)), "conv1", cfg.num_mel_bins, 1)
    x = conv1d(x, "conv2", d, 2)  # [batch, d, 1, t]
    h = b.transpose(b.reshape(x, (batch, d, t)), (0, 2, 1))
    pos = param("embed_positions.weight", (cfg.max_source_positions, d),
                lambda s: sinusoids(*s), frozen=True)
    if t < cfg.max_source_positions:
        pos = b.slice(pos, starts=(0, 0), steps=(1, 1), shape=(t, d))
    h = b.reshape(h + pos, (rows, d))

    def split(x):  # [rows, d] -> [batch, heads, t, dh]
        return b.transpose(b.reshape(x, (batch, t, heads, dh)), (0, 2, 1, 3))

    for i in range(cfg.encoder_layers):
        pre = f"layers.{i}"
        a = layer_norm(h, f"{pre}.self_attn_layer_norm")
        q = split(linear(a, f"{pre}.self_attn.q_proj", d, d))
        k = split(linear(a, f"{pre}.self_attn.k_proj", d, d, bias=False))
        v = split(linear(a, f"{pre}.self_attn.v_proj", d, d))
        a = b.reshape(b.transpose(b.attention(q, k, v), (0, 2, 1, 3)), (rows, d))
        h = h + linear(a, f"{pre}.self_attn.out_proj", d, d)
        m = b.gelu(linear(layer_norm(h, f"{pre}.final_layer_norm"), f"{pre}.fc1", d, f), approximate=act)
        h = h + linear(m, f"{pre}.fc2", f, d)
    b.output("last_hidden_state", b.reshape(layer_norm(h, "layer_norm"), (batch, t, d)))
    return b.build()

"""A Llama decoder with a language-model head, as transformers' `LlamaForCausalLM`
(SmolLM2-135M is one): token embedding, pre-norm blocks of RMS norm, grouped-query
causal self-attention with rotary position embeddings and a SwiGLU MLP, final norm,
and a head that may share its matrix with the embedding.

Parameter names are those of `LlamaForCausalLM.state_dict()`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.builder import Builder, Model
from . import config_from, param_source


@dataclass
class LlamaConfig:
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # None: as many as the query heads
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    initializer_range: float = 0.02

    @classmethod
    def of(cls, config) -> LlamaConfig:
        """From this dataclass, a dict, or a transformers `LlamaConfig` (attributes; its
        `rope_parameters` dict holds rope_theta in transformers 5)."""
        if isinstance(config, cls):
            return config
        out = config_from(cls, config)
        rope = (config.get("rope_parameters") if isinstance(config, dict)
                else getattr(config, "rope_parameters", None)) or {}
        if rope.get("rope_type", "default") != "default":
            raise NotImplementedError(f"RoPE type {rope['rope_type']!r}")
        if "rope_theta" in rope:
            out.rope_theta = rope["rope_theta"]
        return out


def smollm2_135m_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0, rms_norm_eps=1e-5,
                       tie_word_embeddings=True)


def rope_tables(seq: int, dim: int, theta: float):
    """cos, sin [seq, dim] as `LlamaRotaryEmbedding` makes them: frequencies and angles in
    float32 (so a long sequence rounds as transformers' does), halves repeated."""
    inv_freq = (1.0 / (np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))))
    freqs = np.arange(seq, dtype=np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1).astype(np.float32)
    return np.cos(emb), np.sin(emb)


def llama(config, batch: int = 1, seq: int = 128, weights: dict | None = None, seed: int = 0,
          flatten_logits: bool = False) -> Model:
    """Input "input_ids" [batch, seq] (i32); output "logits" [batch, seq, vocab], or
    [batch * seq, vocab] with `flatten_logits` (for a cross-entropy loss over tokens).
    Parameters missing from `weights` are initialised as transformers does."""
    cfg = LlamaConfig.of(config)
    if cfg.hidden_act != "silu":
        raise NotImplementedError(f"MLP activation {cfg.hidden_act!r}")
    rng = np.random.default_rng(seed)
    weights = weights or {}
    b = Builder()

    param = param_source(b, weights)

    normal = lambda s: rng.standard_normal(s, dtype=np.float32) * cfg.initializer_range

    def linear(x, name, n_in, n_out, bias):
        w = param(f"{name}.weight", (n_out, n_in), normal)
        return b.linear(x, w, param(f"{name}.bias", (n_out,), np.zeros) if bias else None)

    def rms_norm(x, name):
        return b.rms_norm(x, param(f"{name}.weight", (d,), np.ones), eps=cfg.rms_norm_eps)

    d, v, f = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    hq = cfg.num_attention_heads
    hk = cfg.num_key_value_heads or hq
    dh = cfg.head_dim or d // hq
    rows = batch * seq
    cos, sin = (b.constant(t) for t in rope_tables(seq, dh, cfg.rope_theta))

    def heads(x, n):  # [rows, n * dh] -> [batch, n, seq, dh]
        return b.transpose(b.reshape(x, (batch, seq, n, dh)), (0, 2, 1, 3))

    ids = b.input("input_ids", (batch, seq), "i32")
    table = param("model.embed_tokens.weight", (v, d), normal)
    h = b.reshape(b.gather(table, ids), (rows, d))
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}"
        a = rms_norm(h, f"{pre}.input_layernorm")
        q = b.rope(heads(linear(a, f"{pre}.self_attn.q_proj", d, hq * dh, cfg.attention_bias), hq), cos, sin)
        k = b.rope(heads(linear(a, f"{pre}.self_attn.k_proj", d, hk * dh, cfg.attention_bias), hk), cos, sin)
        val = heads(linear(a, f"{pre}.self_attn.v_proj", d, hk * dh, cfg.attention_bias), hk)
        a = b.reshape(b.transpose(b.attention(q, k, val, causal=True), (0, 2, 1, 3)), (rows, hq * dh))
        h = h + linear(a, f"{pre}.self_attn.o_proj", hq * dh, d, cfg.attention_bias)
        m = rms_norm(h, f"{pre}.post_attention_layernorm")
        m = b.swiglu(linear(m, f"{pre}.mlp.gate_proj", d, f, cfg.mlp_bias), linear(m, f"{pre}.mlp.up_proj", d, f,
                                                                                    cfg.mlp_bias))
        h = h + linear(m, f"{pre}.mlp.down_proj", f, d, cfg.mlp_bias)
    h = rms_norm(h, "model.norm")
    head = table if cfg.tie_word_embeddings else param("lm_head.weight", (v, d), normal)
    logits = b.linear(h, head)
    b.output("logits", logits if flatten_logits else b.reshape(logits, (batch, seq, v)))
    return b.build()

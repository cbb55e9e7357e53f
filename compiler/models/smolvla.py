"""The action expert of SmolVLA (LeRobot's `VLAFlowMatching` without its VLM): the
flow-matching head that maps a chunk of noisy actions x_t and a time t to a velocity
field v_t, attending to the key/value cache of the VLM's prefix (images, language,
state).

    action_in_proj(x_t) ++ sinusoid(t)  -> action_time_mlp_in -> SiLU -> action_time_mlp_out
    -> lm_expert.layers[0..L) -> lm_expert.norm -> action_out_proj  = v_t

The expert is a narrow Llama (`lm_expert`, a copy of the VLM's text config with the
hidden size scaled by 0.75 and LeRobot's `get_intermediate_size`), one layer per VLM
layer used. Every layer is pre-norm: input RMS norm, attention, residual, post-attention
RMS norm, SwiGLU MLP (gate/up/down), residual. The attention alternates, as LeRobot's
`attention_mode="cross_attn"` with `self_attn_every_n_layers=2`:

  * "self" layers (even i): queries, keys and values from the action tokens by the
    expert's own q/k/v projections, RoPE at positions P .. P+chunk-1 on queries and
    keys; the keys/values attended to are the VLM prefix's cached keys/values of that
    layer (already RoPE'd by the VLM at 0 .. P-1) followed by the action tokens' own;
    the action tokens see the whole prefix and, causally, each other.
  * "cross" layers (odd i): queries from the action tokens (RoPE at 0 .. chunk-1); keys
    and values only from the prefix: the VLM's cached keys/values of that layer passed
    through the expert's k_proj/v_proj (kv_dim -> kv_dim, no RoPE added).

With `attention_mode="self_attn"` every layer is a "self" layer.

RoPE is SmolVLA's own `apply_rope` (rotate-half, max wavelength 10000, not the VLM's
rope_theta); attention scale is head_dim ** -0.5; grouped-query heads (query head j uses
key/value head j // (heads / kv_heads)).

Inputs
  "noisy_actions" [batch, chunk, action_dim]   x_t
  "time_emb"      [batch, hidden]              `time_embedding(t, cfg)`, computed on the
                  host: the sinusoid of t (LeRobot's `create_sinusoidal_pos_embedding`,
                  periods min_period .. max_period, [sin | cos]) is one row per sample and
                  the op table has no sin/cos, so it comes in as an input.
  "prefix_kv"     [layers, 2, batch, prefix, kv_heads * head_dim]: for layer i, [i, 0]
                  the VLM's key states (after its RoPE) and [i, 1] its value states, as
                  LeRobot's `past_key_values[i]["key_states"/"value_states"]` reshaped
                  [batch, prefix, kv_heads * head_dim] (`stack_prefix_kv`). The expert and
                  the VLM share kv_heads and head_dim (LeRobot copies the VLM config).
Output
  "velocity"      [batch, chunk, action_dim]   v_t; flow matching trains it by MSE
                  against u_t = noise - actions.

The prefix is taken as fully valid (no padding inside it): action positions start at P.
Training with the VLM frozen (LeRobot's default `train_expert_only`) is exactly this
graph: the prefix never attends to the actions, so its keys/values are inputs.

Parameter names are those of LeRobot's SmolVLA state dict with the prefixes
"model.vlm_with_expert." and "model." removed (`expert_weights` does it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..ir.builder import Builder, Model
from . import param_source
from .llama import rope_tables


def get_intermediate_size(hidden: int, ffn_dim_multiplier: int = 4, multiple_of: int = 256) -> int:
    """LeRobot's rule for the expert's MLP width (2048 for hidden 720)."""
    hidden = int(ffn_dim_multiplier * int(2 * hidden / 3))
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass
class SmolVLAExpertConfig:
    hidden_size: int = 720
    intermediate_size: int | None = None  # None: get_intermediate_size(hidden_size)
    num_hidden_layers: int = 16  # one per VLM layer used (SmolVLA keeps 16 of SmolVLM2's 32)
    num_attention_heads: int = 15
    num_key_value_heads: int = 5
    head_dim: int = 64
    rms_norm_eps: float = 1e-5
    rope_max_wavelength: float = 10000.0
    attention_mode: str = "cross_attn"  # or "self_attn": every layer attends to prefix + actions
    self_attn_every_n_layers: int = 2  # in cross_attn mode, layers i % n == 0 are "self" layers
    causal_actions: bool = True  # in "self" layers, action tokens see earlier ones only (LeRobot)
    action_dim: int = 32  # max_action_dim: actions zero-padded to it
    chunk_size: int = 50
    prefix_length: int = 113  # 64 image tokens (one camera) + 48 language tokens + 1 state token
    min_period: float = 4e-3
    max_period: float = 4.0
    initializer_range: float = 0.02
    vlm_hidden_size: int = 960  # documentation: hidden_size = 0.75 * this; the VLM is not built

    @property
    def mlp_size(self) -> int:
        return self.intermediate_size or get_intermediate_size(self.hidden_size)

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def layer_kinds(self) -> list:
        n = self.self_attn_every_n_layers
        return ["self" if "cross" not in self.attention_mode or (n > 0 and i % n == 0) else "cross"
                for i in range(self.num_hidden_layers)]


def smolvla_expert_config(**overrides) -> SmolVLAExpertConfig:
    """lerobot/smolvla_base: VLM SmolVLM2-500M-Video-Instruct (text hidden 960, 15 heads,
    5 kv heads, head_dim 64), 16 VLM layers used; expert hidden 720 (0.75 x 960), MLP 2048,
    the VLM's heads and head_dim (q_proj 720 -> 960, k/v_proj 720 -> 320, cross layers'
    k/v_proj 320 -> 320); about 99.8 M parameters."""
    return replace(SmolVLAExpertConfig(), **overrides)


def time_embedding(t, cfg: SmolVLAExpertConfig) -> np.ndarray:
    """[batch] flow-matching times -> "time_emb" [batch, hidden] (float64 math, as LeRobot)."""
    t = np.asarray(t, np.float64).reshape(-1)
    d = cfg.hidden_size
    if d % 2:
        raise ValueError(f"hidden size {d} is odd")
    period = cfg.min_period * (cfg.max_period / cfg.min_period) ** np.linspace(0.0, 1.0, d // 2)
    x = (1.0 / period * 2 * math.pi)[None, :] * t[:, None]
    return np.concatenate([np.sin(x), np.cos(x)], axis=1).astype(np.float32)


def stack_prefix_kv(past_key_values) -> np.ndarray:
    """LeRobot's cache {layer: {"key_states", "value_states"} [batch, prefix, heads, dim]}
    (or a list of such) -> "prefix_kv" [layers, 2, batch, prefix, heads * dim]."""
    layers = [past_key_values[i] for i in range(len(past_key_values))]

    def flat(x):
        x = _numpy(x)
        return x.reshape(x.shape[0], x.shape[1], -1)

    return np.stack([np.stack([flat(c["key_states"]), flat(c["value_states"])]) for c in layers])


def expert_weights(state_dict: dict) -> dict:
    """The expert's tensors of a LeRobot SmolVLA state dict, renamed for `smolvla_expert`."""
    out = {}
    for k, v in state_dict.items():
        for prefix in ("model.vlm_with_expert.", "model.", ""):
            if k.startswith(prefix):
                name = k[len(prefix):]
                if name.startswith(("lm_expert.", "action_in_proj.", "action_out_proj.", "action_time_mlp_")):
                    out[name] = _numpy(v)
                break
    return out


def _numpy(v):
    if hasattr(v, "detach"):  # a torch tensor, bfloat16 included
        v = v.detach().float().cpu().numpy()
    return np.asarray(v, np.float32)


def smolvla_expert(config: SmolVLAExpertConfig | None = None, batch: int = 1, weights: dict | None = None,
                   seed: int = 0) -> Model:
    """The expert as described above. Parameters missing from `weights` are initialised as
    LeRobot's are: lm_expert linears normal(0, initializer_range), norms ones, the
    cross layers' k/v_proj and the action projections as torch.nn.Linear."""
    cfg = config or smolvla_expert_config()
    if cfg.hidden_size % 2:
        raise ValueError("the time sinusoid needs an even hidden size")
    rng = np.random.default_rng(seed)
    weights = weights or {}
    b = Builder()

    param = param_source(b, weights)

    normal = lambda s: rng.standard_normal(s, dtype=np.float32) * cfg.initializer_range
    zeros = lambda s: np.zeros(s, np.float32)
    ones = lambda s: np.ones(s, np.float32)

    def linear(x, name, n_in, n_out, bias=False, torch_init=False):
        bound = 1.0 / math.sqrt(n_in)  # torch.nn.Linear's kaiming-uniform bound, weights and biases
        uniform = lambda s: rng.uniform(-bound, bound, s).astype(np.float32)
        w = param(f"{name}.weight", (n_out, n_in), uniform if torch_init else normal)
        return b.linear(x, w, param(f"{name}.bias", (n_out,), uniform if torch_init else zeros) if bias else None)

    def rms_norm(x, name):
        return b.rms_norm(x, param(f"{name}.weight", (h,), ones), eps=cfg.rms_norm_eps)

    h, f, na = cfg.hidden_size, cfg.mlp_size, cfg.action_dim
    hq, hk, dh, kvd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.kv_dim
    s, p, n_layers = cfg.chunk_size, cfg.prefix_length, cfg.num_hidden_layers
    if hq % hk:
        raise ValueError(f"{hq} query heads do not group over {hk} key/value heads")
    rows = batch * s
    kinds = cfg.layer_kinds()
    rope_at = {}  # first position -> (cos, sin) constants [chunk, head_dim]
    for start in sorted({p if k == "self" else 0 for k in kinds}):
        cos, sin = rope_tables(start + s, dh, cfg.rope_max_wavelength)
        rope_at[start] = (b.constant(cos[start:]), b.constant(sin[start:]))

    def heads(x, n, tokens):  # [batch * tokens, n * dh] -> [batch, n, tokens, dh]
        return b.transpose(b.reshape(x, (batch, tokens, n, dh)), (0, 2, 1, 3))

    x = b.input("noisy_actions", (batch, s, na))
    temb = b.input("time_emb", (batch, h))
    kv = b.input("prefix_kv", (n_layers, 2, batch, p, kvd))

    def prefix(i, j):  # layer i's keys (j = 0) or values (j = 1): [batch * prefix, kv_dim]
        part = b.slice(kv, starts=(i, j, 0, 0, 0), steps=(1,) * 5, shape=(1, 1, batch, p, kvd))
        return b.reshape(part, (batch * p, kvd))

    act = linear(b.reshape(x, (rows, na)), "action_in_proj", na, h, bias=True, torch_init=True)
    tt = b.reshape(b.broadcast_to(b.reshape(temb, (batch, 1, h)), shape=(batch, s, h)), (rows, h))
    at = linear(b.concat(act, tt, axis=1), "action_time_mlp_in", 2 * h, h, bias=True, torch_init=True)
    hid = linear(b.silu(at), "action_time_mlp_out", h, h, bias=True, torch_init=True)

    for i, kind in enumerate(kinds):
        pre = f"lm_expert.layers.{i}"
        a = rms_norm(hid, f"{pre}.input_layernorm")
        cos, sin = rope_at[p if kind == "self" else 0]
        q = b.rope(heads(linear(a, f"{pre}.self_attn.q_proj", h, hq * dh), hq, s), cos, sin)
        if kind == "self":
            k = b.rope(heads(linear(a, f"{pre}.self_attn.k_proj", h, kvd), hk, s), cos, sin)
            v = heads(linear(a, f"{pre}.self_attn.v_proj", h, kvd), hk, s)
            k = b.concat(heads(prefix(i, 0), hk, p), k, axis=2)
            v = b.concat(heads(prefix(i, 1), hk, p), v, axis=2)
            o = b.attention(q, k, v, causal=cfg.causal_actions)
        else:
            k = heads(linear(prefix(i, 0), f"{pre}.self_attn.k_proj", kvd, kvd, torch_init=True), hk, p)
            v = heads(linear(prefix(i, 1), f"{pre}.self_attn.v_proj", kvd, kvd, torch_init=True), hk, p)
            o = b.attention(q, k, v)
        o = b.reshape(b.transpose(o, (0, 2, 1, 3)), (rows, hq * dh))
        hid = hid + linear(o, f"{pre}.self_attn.o_proj", hq * dh, h)
        m = rms_norm(hid, f"{pre}.post_attention_layernorm")
        m = b.swiglu(linear(m, f"{pre}.mlp.gate_proj", h, f), linear(m, f"{pre}.mlp.up_proj", h, f))
        hid = hid + linear(m, f"{pre}.mlp.down_proj", f, h)
    hid = rms_norm(hid, "lm_expert.norm")
    vel = linear(hid, "action_out_proj", h, na, bias=True, torch_init=True)
    b.output("velocity", b.reshape(vel, (batch, s, na)))
    return b.build()

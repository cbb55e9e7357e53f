"""A Stable-Diffusion U-Net: diffusers' `UNet2DConditionModel`, same state_dict names, same math.

    from diffusers import UNet2DConditionModel
    ref = UNet2DConditionModel(...)
    model = unet(dict(ref.config), batch=2, tokens=77,
                 weights={k: v.numpy() for k, v in ref.state_dict().items()})

Inputs
  "sample"                 [batch, in_channels, size, size]  the noisy latent
  "encoder_hidden_states"  [batch, tokens, cross_attention_dim]  the text encoder's output
  "timestep_features"      [batch, block_out_channels[0]]  only when `timestep` is None: the
                           sinusoidal timestep embedding (diffusers' `time_proj` output) from
                           `timestep_features(timesteps, config)`, computed on the host. The op
                           set has no sin/cos, and a host table is exact; a sampling loop feeds
                           a new row per step without recompiling.
  With `timestep=t` (a number, or one per batch row) the features are a constant of the model.
Output
  "noise_pred"             [batch, out_channels, size, size]  (diffusers' `.sample`)

Supported: the SD-1.x/2.x family: CrossAttnDownBlock2D / DownBlock2D, UNetMidBlock2DCrossAttn,
UpBlock2D / CrossAttnUpBlock2D, positional timestep embedding, conv or linear attention
projections, GEGLU feed-forward. Other config options raise NotImplementedError. Dropout is
not modelled (SD's is 0).
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.builder import Builder, Model

DEFAULTS = {  # UNet2DConditionModel's defaults for the options read here
    "sample_size": 64, "in_channels": 4, "out_channels": 4, "flip_sin_to_cos": True, "freq_shift": 0,
    "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    "block_out_channels": (320, 640, 1280, 1280), "layers_per_block": 2, "downsample_padding": 1,
    "norm_num_groups": 32, "norm_eps": 1e-5, "cross_attention_dim": 1280, "attention_head_dim": 8,
    "num_attention_heads": None, "use_linear_projection": False, "conv_in_kernel": 3, "conv_out_kernel": 3,
}
# options that must keep these values (anything else is a different architecture)
_FIXED = {
    "center_input_sample": False, "mid_block_type": "UNetMidBlock2DCrossAttn", "only_cross_attention": False,
    "act_fn": "silu", "resnet_time_scale_shift": "default", "time_embedding_type": "positional",
    "transformer_layers_per_block": 1, "dual_cross_attention": False, "class_embed_type": None,
    "addition_embed_type": None, "num_class_embeds": None, "encoder_hid_dim": None, "encoder_hid_dim_type": None,
    "time_embedding_dim": None, "time_embedding_act_fn": None, "timestep_post_act": None, "time_cond_proj_dim": None,
    "resnet_skip_time_act": False, "attention_type": "default", "cross_attention_norm": None,
    "mid_block_only_cross_attention": None, "reverse_transformer_layers_per_block": None,
    "class_embeddings_concat": False, "mid_block_scale_factor": 1, "resnet_out_scale_factor": 1.0,
}


def full_size_config() -> dict:
    """Stable Diffusion 1.5's U-Net: 64x64 latents, 768-wide text states (~860M parameters)."""
    return {**DEFAULTS, "cross_attention_dim": 768, "sample_size": 64}


def tiny_config() -> dict:
    """The CI size: two levels of 32 and 64 channels on 8x8 latents."""
    return {**DEFAULTS, "block_out_channels": (32, 64), "layers_per_block": 1,
            "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
            "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"),
            "cross_attention_dim": 32, "attention_head_dim": 8, "norm_num_groups": 8, "sample_size": 8}


def _config(config) -> dict:
    cfg = {**DEFAULTS, **{k: v for k, v in dict(config).items() if not k.startswith("_")}}
    for k, v in _FIXED.items():
        got = cfg.get(k, v)
        if isinstance(got, (list, tuple)) and len(set(got)) == 1:  # one value per block, all equal
            got = got[0]
        if got != v:
            raise NotImplementedError(f"UNet2DConditionModel option {k}={got!r} (supported: {v!r})")
    # upcast_attention changes nothing here (everything is float32); dropout is not modelled
    n = len(cfg["block_out_channels"])
    heads = cfg["num_attention_heads"] or cfg["attention_head_dim"]  # diffusers' historical naming
    cfg["heads"] = tuple(heads) if isinstance(heads, (list, tuple)) else (heads,) * n
    cross = cfg["cross_attention_dim"]
    if isinstance(cross, (list, tuple)):
        raise NotImplementedError("a cross_attention_dim per block")
    layers = cfg["layers_per_block"]
    if isinstance(layers, (list, tuple)):
        raise NotImplementedError("layers_per_block per block")
    for t in cfg["down_block_types"]:
        if t not in ("CrossAttnDownBlock2D", "DownBlock2D"):
            raise NotImplementedError(f"down block {t}")
    for t in cfg["up_block_types"]:
        if t not in ("CrossAttnUpBlock2D", "UpBlock2D"):
            raise NotImplementedError(f"up block {t}")
    return cfg


def timestep_features(timesteps, config) -> np.ndarray:
    """diffusers' `Timesteps` (get_timestep_embedding) in float32: [len(timesteps), block_out_channels[0]].

    Each float32 step as torch does it, with correctly rounded exp/sin/cos (torch's float32 exp is
    off by an ulp for a few frequencies: up to 6e-5 apart at t = 999)."""
    cfg = _config(config)
    dim = cfg["block_out_channels"][0]
    half = dim // 2
    t = np.atleast_1d(np.asarray(timesteps, dtype=np.float64)).astype(np.float32)
    exponent = np.float32(-math.log(10000)) * np.arange(half, dtype=np.float32)
    exponent = exponent / np.float32(half - cfg["freq_shift"])
    freqs = np.exp(exponent.astype(np.float64)).astype(np.float32)  # correctly rounded float32 exp
    arg = (t[:, None] * freqs[None, :]).astype(np.float64)  # the float32 product, then exact sin/cos
    sin, cos = np.sin(arg).astype(np.float32), np.cos(arg).astype(np.float32)
    emb = np.concatenate([cos, sin] if cfg["flip_sin_to_cos"] else [sin, cos], axis=-1)
    if dim % 2:
        emb = np.pad(emb, ((0, 0), (0, 1)))
    return emb


class _Net:
    """Builder helpers that fetch weights by name (or make torch's default initialisation)."""

    def __init__(self, b: Builder, weights: dict | None, seed: int):
        self.b, self.w, self.rng = b, weights, np.random.default_rng(seed)

    def param(self, name, shape, fan_in=None, fill=None):
        if self.w is not None:
            if name not in self.w:
                raise KeyError(f"weights lack {name!r}")
            value = np.asarray(self.w[name])
            if value.shape != tuple(shape):
                raise ValueError(f"{name}: weights have shape {value.shape}, the config says {tuple(shape)}")
        elif fill is not None:
            value = np.full(shape, fill, np.float32)
        else:  # torch's default for Linear and Conv2d: uniform(+-1/sqrt(fan_in)), weight and bias
            bound = np.float32(1 / math.sqrt(fan_in))
            value = self.rng.random(shape, dtype=np.float32)
            value *= 2 * bound
            value -= bound
        return self.b.param(name, value)

    def conv(self, name, x, c_out, k, stride=1, padding=None):
        b = self.b
        c_in = x.shape[1]
        w = self.param(f"{name}.weight", (c_out, c_in, k, k), c_in * k * k)
        bias = self.param(f"{name}.bias", (c_out,), c_in * k * k)
        p = (k // 2,) * 4 if padding is None else padding
        y = b.conv2d(x, w, stride=(stride, stride), padding=p, dilation=(1, 1), groups=1)
        return y + b.reshape(bias, (c_out, 1, 1))

    def linear(self, name, x, c_out, bias=True):
        c_in = x.shape[-1]
        w = self.param(f"{name}.weight", (c_out, c_in), c_in)
        return self.b.linear(x, w, self.param(f"{name}.bias", (c_out,), c_in) if bias else None)

    def token_linear(self, name, x, c_out, conv):
        """A 1x1 convolution (conv=True, weight [out, in, 1, 1]) or a Linear on tokens [B, T, C]."""
        if not conv:
            return self.linear(name, x, c_out)
        c_in = x.shape[-1]
        w = self.param(f"{name}.weight", (c_out, c_in, 1, 1), c_in)
        return self.b.linear(x, self.b.reshape(w, (c_out, c_in)), self.param(f"{name}.bias", (c_out,), c_in))

    def norm(self, kind, name, x, eps, groups=None):
        c = x.shape[1] if kind == "group" else x.shape[-1]
        w = self.param(f"{name}.weight", (c,), fill=1.0)
        bias = self.param(f"{name}.bias", (c,), fill=0.0)
        if kind == "group":
            return self.b.group_norm(x, w, bias, groups=groups, eps=eps)
        return self.b.layer_norm(x, w, bias, eps=eps)


def _resnet(net, cfg, name, x, temb_act, c_out):
    b = net.b
    g, eps = cfg["norm_num_groups"], cfg["norm_eps"]
    h = b.silu(net.norm("group", f"{name}.norm1", x, eps, g))
    h = net.conv(f"{name}.conv1", h, c_out, 3)
    t = net.linear(f"{name}.time_emb_proj", temb_act, c_out)
    h = h + b.reshape(t, (t.shape[0], c_out, 1, 1))
    h = b.silu(net.norm("group", f"{name}.norm2", h, eps, g))
    h = net.conv(f"{name}.conv2", h, c_out, 3)
    if x.shape[1] != c_out:
        x = net.conv(f"{name}.conv_shortcut", x, c_out, 1)
    return x + h


def _attention(net, name, x, context, heads):
    """diffusers' Attention with AttnProcessor2_0: x [B, T, C], context [B, S, Cc] or None."""
    b = net.b
    batch, tokens, c = x.shape
    ctx = x if context is None else context
    d = c // heads

    def split(t):  # [B, T, heads * d] -> [B, heads, T, d]
        return b.transpose(b.reshape(t, (batch, t.shape[1], heads, d)), (0, 2, 1, 3))

    q = split(net.linear(f"{name}.to_q", x, c, bias=False))
    k = split(net.linear(f"{name}.to_k", ctx, c, bias=False))
    v = split(net.linear(f"{name}.to_v", ctx, c, bias=False))
    o = b.attention(q, k, v, causal=False, scale=1.0 / math.sqrt(d))
    o = b.reshape(b.transpose(o, (0, 2, 1, 3)), (batch, tokens, c))
    return net.linear(f"{name}.to_out.0", o, c)


def _transformer(net, cfg, name, x, context, heads):
    """Transformer2DModel with one BasicTransformerBlock (self-attention, cross-attention, GEGLU)."""
    b = net.b
    batch, c, hgt, wid = x.shape
    conv = not cfg["use_linear_projection"]
    h = net.norm("group", f"{name}.norm", x, 1e-6, cfg["norm_num_groups"])
    h = b.transpose(b.reshape(h, (batch, c, hgt * wid)), (0, 2, 1))  # [B, HW, C]
    h = net.token_linear(f"{name}.proj_in", h, c, conv)
    blk = f"{name}.transformer_blocks.0"
    eps = cfg["norm_eps"]
    h = h + _attention(net, f"{blk}.attn1", net.norm("layer", f"{blk}.norm1", h, eps), None, heads)
    h = h + _attention(net, f"{blk}.attn2", net.norm("layer", f"{blk}.norm2", h, eps), context, heads)
    f = net.linear(f"{blk}.ff.net.0.proj", net.norm("layer", f"{blk}.norm3", h, eps), 8 * c)  # GEGLU
    half = (batch, hgt * wid, 4 * c)
    value = b.slice(f, starts=(0, 0, 0), steps=(1, 1, 1), shape=half)
    gate = b.slice(f, starts=(0, 0, 4 * c), steps=(1, 1, 1), shape=half)
    h = h + net.linear(f"{blk}.ff.net.2", value * b.gelu(gate, approximate="none"), c)
    h = net.token_linear(f"{name}.proj_out", h, c, conv)
    return x + b.reshape(b.transpose(h, (0, 2, 1)), (batch, c, hgt, wid))


def _upsample_nearest2x(b, x):
    n, c, h, w = x.shape
    y = b.broadcast_to(b.reshape(x, (n, c, h, 1, w, 1)), shape=(n, c, h, 2, w, 2))
    return b.reshape(y, (n, c, 2 * h, 2 * w))


def unet(config=None, batch: int = 1, tokens: int = 77, size: int | None = None, weights: dict | None = None,
         seed: int = 0, timestep=None) -> Model:
    """config: UNet2DConditionModel.config (or a dict of its keys; missing keys take diffusers'
    defaults); size: the latent's height and width (default config["sample_size"]), a multiple
    of 2 ** (number of down blocks - 1)."""
    cfg = _config(config if config is not None else full_size_config())
    chans, heads, layers = cfg["block_out_channels"], cfg["heads"], cfg["layers_per_block"]
    size = size or cfg["sample_size"]
    n_levels = len(chans)
    if size % 2 ** (n_levels - 1):
        raise NotImplementedError(f"size {size} is not a multiple of {2 ** (n_levels - 1)}")
    b = Builder()
    net = _Net(b, weights, seed)
    sample = b.input("sample", (batch, cfg["in_channels"], size, size))
    context = b.input("encoder_hidden_states", (batch, tokens, cfg["cross_attention_dim"]))
    if timestep is None:
        t_emb = b.input("timestep_features", (batch, chans[0]))
    else:
        ts = np.broadcast_to(np.atleast_1d(np.asarray(timestep, dtype=np.float64)), (batch,))
        t_emb = b.constant(timestep_features(ts, cfg))

    temb = net.linear("time_embedding.linear_1", t_emb, 4 * chans[0])
    temb = net.linear("time_embedding.linear_2", b.silu(temb), 4 * chans[0])
    temb_act = b.silu(temb)  # every resnet applies SiLU before its time projection

    pad = cfg["downsample_padding"]
    down_pad = (pad, pad, pad, pad) if pad else (0, 0, 1, 1)
    h = net.conv("conv_in", sample, chans[0], cfg["conv_in_kernel"])
    skips = [h]
    for i, kind in enumerate(cfg["down_block_types"]):
        name = f"down_blocks.{i}"
        for j in range(layers):
            h = _resnet(net, cfg, f"{name}.resnets.{j}", h, temb_act, chans[i])
            if kind == "CrossAttnDownBlock2D":
                h = _transformer(net, cfg, f"{name}.attentions.{j}", h, context, heads[i])
            skips.append(h)
        if i < n_levels - 1:
            h = net.conv(f"{name}.downsamplers.0.conv", h, chans[i], 3, stride=2, padding=down_pad)
            skips.append(h)

    h = _resnet(net, cfg, "mid_block.resnets.0", h, temb_act, chans[-1])
    h = _transformer(net, cfg, "mid_block.attentions.0", h, context, heads[-1])
    h = _resnet(net, cfg, "mid_block.resnets.1", h, temb_act, chans[-1])

    rev_chans, rev_heads = list(reversed(chans)), list(reversed(heads))
    for i, kind in enumerate(cfg["up_block_types"]):
        name = f"up_blocks.{i}"
        for j in range(layers + 1):
            h = b.concat(h, skips.pop(), axis=1)
            h = _resnet(net, cfg, f"{name}.resnets.{j}", h, temb_act, rev_chans[i])
            if kind == "CrossAttnUpBlock2D":
                h = _transformer(net, cfg, f"{name}.attentions.{j}", h, context, rev_heads[i])
        if i < n_levels - 1:
            h = net.conv(f"{name}.upsamplers.0.conv", _upsample_nearest2x(b, h), rev_chans[i], 3)

    h = b.silu(net.norm("group", "conv_norm_out", h, cfg["norm_eps"], cfg["norm_num_groups"]))
    b.output("noise_pred", net.conv("conv_out", h, cfg["out_channels"], cfg["conv_out_kernel"]))
    return b.build()

"""The SmolVLA action expert builder against a float64 PyTorch module written here after
LeRobot's SmolVLA (`embed_suffix`, `forward_attn_layer`, `forward_cross_attn_layer`,
`apply_rope`, `eager_attention_forward`, the denoising step's masks and positions):
forward and one flow-matching training step on a tiny config with one "self" and one
"cross" layer, an all-"self" variant in the interpreter, and a compile of the full size."""
import math
import time

import numpy as np
import torch
from harness import check_forward, check_training_step, rel, state_dict_numpy
from meganeura.compiler import compile_model, run_graph
from meganeura.compiler.models.smolvla import (
    SmolVLAExpertConfig,
    expert_weights,
    smolvla_expert,
    smolvla_expert_config,
    stack_prefix_kv,
    time_embedding,
)
from meganeura.compiler.ir.training import TrainConfig
from torch import nn

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "action_dim": 6, "chunk_size": 5, "prefix_length": 7}
BATCH = 2


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def apply_rope(x, positions, max_wavelength):
    """LeRobot's: x [B, L, H, D], positions [L]; angles in float32."""
    d_half = x.shape[-1] // 2
    freq_exponents = (2.0 / x.shape[-1]) * torch.arange(d_half, dtype=torch.float32, device=x.device)
    timescale = max_wavelength ** freq_exponents
    radians = (positions[:, None].to(torch.float32) / timescale[None, :])[None, :, None, :]
    sin, cos = torch.sin(radians).to(x.dtype), torch.cos(radians).to(x.dtype)
    x1, x2 = x.split(d_half, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def eager_attention(mask, q, k, v, heads, kv_heads):
    """LeRobot's eager_attention_forward: q [B, L, H, D], k/v [B, T, Hk, D], mask [L, T] bool."""
    bsz, t, _, d = k.shape
    g = heads // kv_heads
    k = k[:, :, :, None, :].expand(bsz, t, kv_heads, g, d).reshape(bsz, t, heads, d)
    v = v[:, :, :, None, :].expand(bsz, t, kv_heads, g, d).reshape(bsz, t, heads, d)
    w = torch.matmul(q.transpose(1, 2), k.transpose(1, 2).transpose(2, 3)) * d ** -0.5
    w = torch.where(mask[None, None], w, torch.finfo(w.dtype).min)
    out = torch.matmul(torch.softmax(w, dim=-1), v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
    return out.reshape(bsz, -1, heads * d)


class Attention(nn.Module):
    def __init__(self, c: SmolVLAExpertConfig, cross: bool):
        super().__init__()
        kv_in = c.kv_dim if cross else c.hidden_size
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(kv_in, c.kv_dim, bias=False)
        self.v_proj = nn.Linear(kv_in, c.kv_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.mlp_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.mlp_size, bias=False)
        self.down_proj = nn.Linear(c.mlp_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c, cross):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c, cross)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)


class Expert(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layers = nn.ModuleList(Layer(c, k == "cross") for k in c.layer_kinds())
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class ActionExpert(nn.Module):
    """The suffix half of VLAFlowMatching.denoise_step with a prefix KV cache."""

    def __init__(self, c: SmolVLAExpertConfig):
        super().__init__()
        self.c = c
        h = c.hidden_size
        self.action_in_proj = nn.Linear(c.action_dim, h)
        self.action_out_proj = nn.Linear(h, c.action_dim)
        self.action_time_mlp_in = nn.Linear(2 * h, h)
        self.action_time_mlp_out = nn.Linear(h, h)
        self.lm_expert = Expert(c)

    def time_emb(self, t):  # LeRobot's create_sinusoidal_pos_embedding
        c = self.c
        fraction = torch.linspace(0.0, 1.0, c.hidden_size // 2, dtype=torch.float64, device=t.device)
        period = c.min_period * (c.max_period / c.min_period) ** fraction
        sin_input = (1.0 / period * 2 * math.pi)[None, :] * t[:, None]
        return torch.cat([torch.sin(sin_input), torch.cos(sin_input)], dim=1)

    def forward(self, noisy_actions, t, prefix_kv):  # masks and positions on the inputs' device (bench: CUDA)
        c, dev = self.c, noisy_actions.device
        bsz, s, _ = noisy_actions.shape
        p, hk, d = c.prefix_length, c.num_key_value_heads, c.head_dim
        a = self.action_in_proj(noisy_actions)
        te = self.time_emb(t).to(a.dtype)[:, None, :].expand_as(a)
        x = self.action_time_mlp_out(nn.functional.silu(self.action_time_mlp_in(torch.cat([a, te], dim=2))))
        ar = torch.arange(s, device=dev)
        suffix_mask = ar[None, :] <= ar[:, None] if c.causal_actions else torch.ones(s, s, dtype=torch.bool, device=dev)
        self_mask = torch.cat([torch.ones(s, p, dtype=torch.bool, device=dev), suffix_mask], dim=1)
        positions = p + ar
        for i, (layer, kind) in enumerate(zip(self.lm_expert.layers, c.layer_kinds())):
            at = layer.self_attn
            pk = prefix_kv[i, 0].reshape(bsz, p, hk, d)
            pv = prefix_kv[i, 1].reshape(bsz, p, hk, d)
            y = layer.input_layernorm(x)
            q = at.q_proj(y).view(bsz, s, -1, d)
            if kind == "self":
                q, k = apply_rope(q, positions, c.rope_max_wavelength), \
                    apply_rope(at.k_proj(y).view(bsz, s, -1, d), positions, c.rope_max_wavelength)
                k, v = torch.cat([pk, k], dim=1), torch.cat([pv, at.v_proj(y).view(bsz, s, -1, d)], dim=1)
                o = eager_attention(self_mask, q, k, v, c.num_attention_heads, hk)
            else:
                k = at.k_proj(pk.reshape(bsz, p, -1)).view(bsz, p, -1, d)
                v = at.v_proj(pv.reshape(bsz, p, -1)).view(bsz, p, -1, d)
                q = apply_rope(q, positions - positions.min(), c.rope_max_wavelength)
                o = eager_attention(torch.ones(s, p, dtype=torch.bool, device=dev), q, k, v, c.num_attention_heads, hk)
            x = at.o_proj(o) + x
            x = layer.mlp(layer.post_attention_layernorm(x)) + x
        return self.action_out_proj(self.lm_expert.norm(x))


def reference(cfg, seed=0):
    torch.manual_seed(seed)
    m = ActionExpert(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif "lm_expert" in name and "self_attn.o_proj" not in name:
                p.mul_(3.0)  # larger expert weights: attention that is not near-uniform
    return m


def inputs(cfg, seed=0):
    rng = np.random.default_rng(seed)
    t = rng.uniform(0.001, 1.0, BATCH)
    return t, {"noisy_actions": rng.standard_normal((BATCH, cfg.chunk_size, cfg.action_dim)),
               "time_emb": time_embedding(t, cfg).astype(np.float64),
               "prefix_kv": rng.standard_normal((cfg.num_hidden_layers, 2, BATCH, cfg.prefix_length, cfg.kv_dim))}


def test_smolvla_expert_forward_and_training_step(device):
    cfg = smolvla_expert_config(**TINY)
    assert cfg.layer_kinds() == ["self", "cross"]
    ref = reference(cfg).double()
    weights = state_dict_numpy(ref)
    model = smolvla_expert(cfg, batch=BATCH, weights=weights)
    assert set(model.params) == set(weights)
    t, ins = inputs(cfg)
    tt = torch.tensor(t)
    forward = lambda noisy_actions, time_emb, prefix_kv: ref(noisy_actions, tt, prefix_kv)
    errors = check_forward(model, forward, ins, device)
    print("forward", errors)
    target = np.random.default_rng(1).standard_normal((BATCH, cfg.chunk_size, cfg.action_dim))  # u_t
    errors = check_training_step(
        model, ref, lambda m, x, y: nn.functional.mse_loss(m(x["noisy_actions"], tt, x["prefix_kv"]), y),
        ins, target, device, loss="mse")
    print("training step, worst (interpreter, gpu):", tuple(max(v[j] for v in errors.values()) for j in (0, 1)))


def test_smolvla_expert_all_self_attention_in_the_interpreter():
    cfg = smolvla_expert_config(**{**TINY, "num_hidden_layers": 3}, attention_mode="self_attn",
                                causal_actions=False)
    assert cfg.layer_kinds() == ["self"] * 3
    ref = reference(cfg, seed=2).double()
    model = smolvla_expert(cfg, batch=BATCH, weights=state_dict_numpy(ref))
    t, ins = inputs(cfg, seed=3)
    with torch.no_grad():
        want = ref(torch.tensor(ins["noisy_actions"]), torch.tensor(t), torch.tensor(ins["prefix_kv"])).numpy()
    got = run_graph(model.graph, ins, np.float64)[0]["velocity"]
    assert rel(got, want) < 1e-6


def test_lerobot_names_and_cache_layout():
    sd = {"model.vlm_with_expert.lm_expert.norm.weight": torch.ones(4, dtype=torch.bfloat16),
          "model.vlm_with_expert.vlm.model.text_model.norm.weight": torch.ones(4),
          "model.action_in_proj.bias": torch.zeros(4), "model.state_proj.bias": torch.zeros(4)}
    assert sorted(expert_weights(sd)) == ["action_in_proj.bias", "lm_expert.norm.weight"]
    cache = {i: {"key_states": np.full((2, 3, 5, 4), i), "value_states": np.full((2, 3, 5, 4), -i)} for i in range(2)}
    kv = stack_prefix_kv(cache)
    assert kv.shape == (2, 2, 2, 3, 20) and kv[1, 0].min() == 1 and kv[1, 1].max() == -1


def test_smolvla_expert_full_size_compiles():
    cfg = smolvla_expert_config()
    assert (cfg.mlp_size, cfg.kv_dim, cfg.layer_kinds()[:3]) == (2048, 320, ["self", "cross", "self"])
    t0 = time.perf_counter()
    model = smolvla_expert(cfg, batch=1)
    t1 = time.perf_counter()
    package = compile_model(model, TrainConfig(loss="mse", optimizer="adamw"))
    t2 = time.perf_counter()
    n = sum(v.size for v in model.params.values())
    print(f"SmolVLA expert (hidden 720, 16 layers, chunk 50, prefix 113): {n / 1e6:.1f} M params, "
          f"build {t1 - t0:.2f} s, compile {t2 - t1:.2f} s, package {len(package) / 2**20:.0f} MiB")
    assert 99e6 < n < 101e6

"""The U-Net builder against diffusers' UNet2DConditionModel at a tiny configuration: forward
output and one training step (mse on the noise prediction)."""
import diffusers
import numpy as np
import torch
from harness import check_forward, check_training_step, state_dict_numpy
from meganeura.compiler import run_graph
from meganeura.compiler.models.unet import (
    timestep_features,
    tiny_config,
    unet,
)

TINY = tiny_config()  # block_out_channels (32, 64), 1 layer per block, 8 heads, 8 groups, 8x8 latents
BATCH, TOKENS, TIMESTEPS = 2, 5, np.array([999, 17])


def reference():
    torch.manual_seed(0)
    ref = diffusers.UNet2DConditionModel(**TINY)
    with torch.no_grad():  # diffusers zero-initialises no weight, but make norms non-trivial too
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return ref


def inputs(cfg):
    rng = np.random.default_rng(0)
    return {"sample": rng.standard_normal((BATCH, 4, 8, 8)),
            "encoder_hidden_states": rng.standard_normal((BATCH, TOKENS, cfg["cross_attention_dim"]))}


def test_timestep_features_match_diffusers():
    from diffusers.models.embeddings import get_timestep_embedding

    for dim, ts in ((32, [0, 1, 17, 999, 500.5]), (320, [999, 3])):
        cfg = {**TINY, "block_out_channels": (dim, 64)}
        ours = timestep_features(ts, cfg)
        ref = get_timestep_embedding(torch.tensor(ts), dim, flip_sin_to_cos=True, downscale_freq_shift=0).numpy()
        # torch's float32 exp (SLEEF, 1 ulp) rounds 3 of SD's 160 frequencies the other way from a
        # correctly rounded exp; times t = 999 that moves a sinusoid by up to 6e-5 (measured)
        assert np.abs(ours - ref).max() < 1e-4
        assert np.abs(ours - ref).mean() < 1e-6


def test_unet_forward_and_training_step(device):
    ref = reference()
    cfg = dict(ref.config)
    sd = state_dict_numpy(ref)
    # timestep fed as features: the forward check; baked in as a constant: the training step
    model = unet(cfg, batch=BATCH, tokens=TOKENS, weights=sd)
    assert set(model.graph.params) == set(sd)
    ins = inputs(cfg)
    fwd = check_forward(model, lambda sample, encoder_hidden_states, timestep_features:
                        ref.double().eval()(sample, torch.tensor(TIMESTEPS), encoder_hidden_states).sample,
                        {**ins, "timestep_features": timestep_features(TIMESTEPS, cfg)}, device)

    model = unet(cfg, batch=BATCH, tokens=TOKENS, weights=sd, timestep=TIMESTEPS)
    target = np.random.default_rng(1).standard_normal((BATCH, 4, 8, 8))
    step = check_training_step(
        model, ref, lambda m, x, y: torch.nn.functional.mse_loss(
            m(x["sample"], torch.tensor(TIMESTEPS), x["encoder_hidden_states"]).sample, y),
        ins, target, device, loss="mse")
    worst = max(step.items(), key=lambda kv: kv[1][1])
    print(f"\nunet tiny: forward {fwd}; training step worst gpu error {worst} over {len(step)} tensors")


def test_unet_variant_config_on_the_interpreter():
    """SD-2-style linear attention projections, per-block head counts, 3 levels: float64 only."""
    cfg = {**TINY, "block_out_channels": (16, 16, 32), "use_linear_projection": True, "attention_head_dim": (2, 4, 8),
           "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
           "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D")}
    torch.manual_seed(1)
    ref = diffusers.UNet2DConditionModel(**cfg).double().eval()
    model = unet(dict(ref.config), batch=BATCH, tokens=TOKENS, weights=state_dict_numpy(ref), timestep=TIMESTEPS)
    ins = inputs(cfg)
    with torch.no_grad():
        want = ref(torch.tensor(ins["sample"]), torch.tensor(TIMESTEPS), torch.tensor(ins["encoder_hidden_states"]))
    got = run_graph(model.graph, ins, np.float64)[0]["noise_pred"]
    want = want.sample.numpy()
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-6


# The SD-1.5-size compile (860 M parameters, ~10 GB while writing) is measured by
# bench/compile_times.py, not in CI.

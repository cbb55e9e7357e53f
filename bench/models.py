"""The paper's five workloads and DINOv2, at full size (tiny configurations with smoke=True),
registered into workloads.WORKLOADS for bench/run.py.

Each builds the PyTorch model first (random initialisation, the tests' twin of our
builder: transformers' Dinov2Model / LlamaForCausalLM / WhisperEncoder, diffusers'
UNet2DConditionModel, the tests' torchvision-layout ResNet and LeRobot-style SmolVLA
action expert), then our builder's model from its state dict: the same weights by name.
Biases and norm scales get a small random offset (as in the tests) so that the output
check sees them. Both sides train with AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
weight decay 0.01); PyTorch's is torch.optim.AdamW's default for-each implementation on
CUDA (not fused).

    full size                                       smoke
    DINOv2 ViT-S/14, 224x224, batch 1, mse          width 32, 2 layers, 56x56 (70x70 grid)
    ResNet-50, 224x224, batch 16, cross entropy     width 8, 48x48, batch 2, 5 classes
    SmolLM2-135M, batch 4 x 128, cross entropy      width 32, 2 layers, vocab 97, 2 x 16
    Whisper-tiny encoder, 3000 frames, mse          width 32, 2 layers, 8 mels x 32 frames
    SD-1.5 U-Net, 64x64 latent, 77 tokens, mse      diffusers-tiny: (32, 64), 8x8, 5 tokens
    SmolVLA action expert, batch 1, mse             width 32, 2 layers, chunk 5, prefix 7
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from workloads import WORKLOADS, Case, module_side

TWINS = Path(__file__).resolve().parents[1] / "tests" / "compiler" / "models"  # test_resnet.py, test_smolvla.py
LR = 1e-3


def _twins():
    if str(TWINS) not in sys.path:
        sys.path.insert(0, str(TWINS))


def _train(loss):
    from meganeura.compiler import TrainConfig

    return TrainConfig(loss=loss, optimizer="adamw", lr=LR)


def _state(module) -> dict:
    return {k: v.detach().cpu().float().numpy().copy() for k, v in module.state_dict().items()}


def _offset_vectors(module, seed: int, scale: float = 0.05):
    """Biases and norm scales (every trainable 1-D parameter) a little away from 0 and 1."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad and p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=g) * scale)


def _torch_side(module, forward, loss_fn, inputs: dict, labels, extra: dict | None = None, notes: dict | None = None):
    """setup(device) -> TorchSide (infer, train_step) for `module`: forward(module, tensors) ->
    output, loss_fn(output, labels) -> loss (workloads.module_side: eval() for infer, train()
    for the training step)."""

    def setup(dev):
        import torch

        def tensor(v):
            v = np.asarray(v)
            return torch.tensor(v, dtype=torch.int64 if v.dtype.kind in "iub" else torch.float32, device=dev)

        m = module.to(dev)
        ins = {k: tensor(v) for k, v in {**inputs, **(extra or {})}.items()}
        y = tensor(labels)
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=LR)
        if notes is not None:
            attn = getattr(getattr(m, "config", None), "_attn_implementation", None)
            notes.update({"torch_adamw": "foreach" if dev != "cpu" else "for-loop (cpu)",
                          **({"torch_attention": attn} if attn else {})})
        return module_side(m, lambda: forward(m, ins), lambda out: loss_fn(out, y), opt)
    setup.module = module  # (bench/run.py --weights f16 rounds its weights as the package stores them)
    return setup


def _mse(out, y):
    import torch

    return torch.nn.functional.mse_loss(out, y)


def _ce(out, y):
    import torch

    return torch.nn.functional.cross_entropy(out, y)


# ---------------------------------------------------------------------------- the models

def dinov2_vits14(smoke=False):
    import transformers
    from meganeura.compiler.models.dinov2 import dinov2

    if smoke:
        kw, size = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=70), 56
    else:  # facebook/dinov2-small: 37x37 position grid (518 / 14) interpolated to 16x16
        kw, size = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, image_size=518), 224
    import torch

    torch.manual_seed(0)
    cfg = transformers.Dinov2Config(patch_size=14, **kw)
    ref = transformers.Dinov2Model(cfg)
    _offset_vectors(ref, 1)
    model = dinov2(cfg, batch=1, height=size, width=size, weights=_state(ref))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    tokens = 1 + (size // 14) ** 2
    labels = rng.standard_normal((1, tokens, cfg.hidden_size)).astype(np.float32)
    notes = {}
    setup = _torch_side(ref, lambda m, t: m(pixel_values=t["pixel_values"]).last_hidden_state, _mse,
                        {"pixel_values": x}, labels, notes=notes)
    return Case(model, _train("mse"), {"pixel_values": x, "labels": labels}, setup, "last_hidden_state",
                config=f"ViT width {cfg.hidden_size}, {cfg.num_hidden_layers} layers, {size}x{size}, batch 1, "
                       "mse on last_hidden_state", notes=notes, torch_variants=lambda dev: _faster_torch(ref, x, dev))


def _faster_torch(ref, x, dev):
    """PyTorch's other baselines for DINOv2 inference when bench/run.py runs without
    --fast-paths (which makes these for every workload): a CUDA graph of the eager forward,
    and torch.compile (default mode): {name: (infer fn, seconds to make it)}."""
    import time

    import torch

    m = ref.to(dev).eval()
    px = torch.tensor(x, device=dev)

    def eager():
        with torch.no_grad():
            return m(pixel_values=px).last_hidden_state
    out = {}
    t = time.perf_counter()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            eager()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        eager()
    torch.cuda.synchronize()
    out["cuda_graph"] = (graph.replay, time.perf_counter() - t)
    t = time.perf_counter()
    compiled = torch.compile(m)

    def compiled_infer():
        with torch.no_grad():
            return compiled(pixel_values=px).last_hidden_state
    compiled_infer()
    torch.cuda.synchronize()
    out["torch_compile"] = (compiled_infer, time.perf_counter() - t)
    return out


def resnet50(smoke=False):
    import torch
    from meganeura.compiler.models.resnet import resnet50 as build

    _twins()
    from test_resnet import Bottleneck, ResNet, randomize_bn

    batch, size, classes, width = (2, 48, 5, 8) if smoke else (16, 224, 1000, 64)
    torch.manual_seed(0)
    ref = ResNet(Bottleneck, (3, 4, 6, 3), classes, width)
    randomize_bn(ref, torch.Generator().manual_seed(1))
    sd = {k: v for k, v in _state(ref).items() if not k.endswith("num_batches_tracked")}
    model = build(batch=batch, image_size=size, num_classes=classes, width=width, weights=sd)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    labels = rng.integers(0, classes, batch)
    notes = {}
    setup = _torch_side(ref, lambda m, t: m(t["x"]), _ce, {"x": x}, labels, notes=notes)
    return Case(model, _train("cross_entropy"), {"x": x, "labels": labels}, setup, "logits", paper=True,
                config=f"width {width}, {size}x{size}, batch {batch}, {classes} classes, cross entropy "
                       "(batch norms: running stats in infer, batch stats in training)", notes=notes)


def smollm2_135m(smoke=False):
    import torch
    import transformers
    from meganeura.compiler.models.llama import llama

    if smoke:
        kw = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
        batch, seq = 2, 16
    else:  # HuggingFaceTB/SmolLM2-135M (smollm2_135m_config)
        kw = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3,
                  rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
        batch, seq = 4, 128
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(rms_norm_eps=1e-5, tie_word_embeddings=True, **kw)
    ref = transformers.LlamaForCausalLM(cfg)
    _offset_vectors(ref, 1)
    model = llama(cfg, batch=batch, seq=seq, weights=_state(ref), flatten_logits=True)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.int32)
    labels = rng.integers(0, cfg.vocab_size, batch * seq)
    v = cfg.vocab_size
    notes = {}
    setup = _torch_side(ref, lambda m, t: m(input_ids=t["input_ids"], use_cache=False).logits.reshape(-1, v), _ce,
                        {"input_ids": ids}, labels, notes=notes)
    return Case(model, _train("cross_entropy"), {"input_ids": ids, "labels": labels}, setup, "logits", paper=True,
                config=f"width {cfg.hidden_size}, {cfg.num_hidden_layers} layers, vocab {v}, batch {batch} x seq {seq}, "
                       "cross entropy over every token", notes=notes)


def whisper_tiny_encoder(smoke=False):
    import torch
    import transformers
    from meganeura.compiler.models.whisper import whisper_encoder
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    if smoke:
        kw = dict(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, num_mel_bins=8,
                  max_source_positions=16)
    else:  # openai/whisper-tiny's encoder
        kw = dict(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536, num_mel_bins=80,
                  max_source_positions=1500)
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(**kw)
    ref = WhisperEncoder(cfg)
    _offset_vectors(ref, 1)  # the sinusoidal position table is frozen (no grad) and keeps its values
    model = whisper_encoder(cfg, batch=1, weights=_state(ref))
    frames = 2 * cfg.max_source_positions
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, cfg.num_mel_bins, frames)).astype(np.float32)
    labels = rng.standard_normal((1, cfg.max_source_positions, cfg.d_model)).astype(np.float32)
    notes = {}
    setup = _torch_side(ref, lambda m, t: m(t["input_features"]).last_hidden_state, _mse,
                        {"input_features": x}, labels, notes=notes)
    return Case(model, _train("mse"), {"input_features": x, "labels": labels}, setup, "last_hidden_state", paper=True,
                config=f"width {cfg.d_model}, {cfg.encoder_layers} layers, {cfg.num_mel_bins} mels x {frames} frames, "
                       "batch 1, mse on last_hidden_state", notes=notes)


def sd15_unet(smoke=False):
    import diffusers
    import torch
    from meganeura.compiler.models.unet import full_size_config, tiny_config, unet

    cfg, tokens, timestep = (tiny_config(), 5, 999) if smoke else (full_size_config(), 77, 999)
    torch.manual_seed(0)
    ref = diffusers.UNet2DConditionModel(**cfg)
    _offset_vectors(ref, 1)
    cfg = dict(ref.config)
    size = cfg["sample_size"]
    # the timestep is a constant of our graph (its sinusoid computed at compile time); torch
    # embeds the same timestep on every call
    model = unet(cfg, batch=1, tokens=tokens, weights=_state(ref), timestep=[timestep])
    rng = np.random.default_rng(0)
    ins = {"sample": rng.standard_normal((1, cfg["in_channels"], size, size)).astype(np.float32),
           "encoder_hidden_states": rng.standard_normal((1, tokens, cfg["cross_attention_dim"])).astype(np.float32)}
    labels = rng.standard_normal((1, cfg["out_channels"], size, size)).astype(np.float32)
    notes = {}
    setup = _torch_side(ref, lambda m, t: m(t["sample"], t["timestep"], t["encoder_hidden_states"]).sample, _mse,
                        ins, labels, extra={"timestep": np.array([float(timestep)], np.float32)}, notes=notes)
    notes["torch_attention"] = "diffusers AttnProcessor2_0 (sdpa)"
    return Case(model, _train("mse"), {**ins, "labels": labels}, setup, "noise_pred", paper=True,
                config=f"channels {tuple(cfg['block_out_channels'])}, {size}x{size} latent, {tokens} tokens, "
                       f"timestep {timestep}, batch 1, mse on the noise prediction", notes=notes)


def smolvla_expert(smoke=False):
    import torch
    from meganeura.compiler.models.smolvla import smolvla_expert as build
    from meganeura.compiler.models.smolvla import smolvla_expert_config, time_embedding

    if smoke:
        cfg = smolvla_expert_config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=8, action_dim=6, chunk_size=5, prefix_length=7)
    else:  # lerobot/smolvla_base's expert: hidden 720, 16 layers, chunk 50, prefix 113
        cfg = smolvla_expert_config()
    batch = 1
    torch.manual_seed(0)
    _twins()
    from test_smolvla import ActionExpert  # LeRobot's math, same state-dict names

    ref = ActionExpert(cfg)
    _offset_vectors(ref, 1)
    model = build(cfg, batch=batch, weights=_state(ref))
    rng = np.random.default_rng(0)
    t = rng.uniform(0.001, 1.0, batch)
    ins = {"noisy_actions": rng.standard_normal((batch, cfg.chunk_size, cfg.action_dim)).astype(np.float32),
           "time_emb": time_embedding(t, cfg),
           "prefix_kv": rng.standard_normal((cfg.num_hidden_layers, 2, batch, cfg.prefix_length,
                                             cfg.kv_dim)).astype(np.float32)}
    labels = rng.standard_normal((batch, cfg.chunk_size, cfg.action_dim)).astype(np.float32)  # u_t
    torch_ins = {k: v for k, v in ins.items() if k != "time_emb"}  # torch computes the sinusoid from t itself
    notes = {}
    setup = _torch_side(ref, lambda m, x: m(x["noisy_actions"], x["t"], x["prefix_kv"]), _mse, torch_ins, labels,
                        extra={"t": t}, notes=notes)
    notes["torch_attention"] = "eager (LeRobot's eager_attention_forward)"
    return Case(model, _train("mse"), {**ins, "labels": labels}, setup, "velocity", paper=True,
                config=f"hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers ({cfg.attention_mode}), chunk "
                       f"{cfg.chunk_size}, prefix {cfg.prefix_length}, batch {batch}, flow-matching mse", notes=notes)


WORKLOADS.update({
    "dinov2_vits14": dinov2_vits14,
    "resnet50": resnet50,
    "smollm2_135m": smollm2_135m,
    "whisper_tiny_encoder": whisper_tiny_encoder,
    "sd15_unet": sd15_unet,
    "smolvla_expert": smolvla_expert,
})

"""The Whisper encoder builder against transformers' WhisperEncoder (random
initialisation, float64 reference): forward, one training step (the position table
frozen, as in transformers), a WhisperModel state_dict ("encoder." names) through a
safetensors file, and a compile of the Whisper-tiny encoder at 3000 frames."""
import time

import numpy as np
import torch
import transformers
from harness import check_forward, check_training_step, rel, state_dict_numpy
from meganeura.compiler import compile_model, run_graph
from meganeura.compiler.models.whisper import (
    sinusoids,
    whisper_encoder,
    whisper_tiny_encoder_config,
)
from meganeura.compiler.ir.training import TrainConfig
from safetensors.numpy import load_file
from safetensors.torch import save_file
from transformers.models.whisper.modeling_whisper import WhisperEncoder

TINY = {"d_model": 32, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 64, "num_mel_bins": 8,
        "max_source_positions": 10, "decoder_layers": 1, "decoder_attention_heads": 4, "decoder_ffn_dim": 64,
        "vocab_size": 97, "max_target_positions": 16, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
        "decoder_start_token_id": 3}


def perturbed(module, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:  # not the sinusoidal position table
                p.add_(torch.randn_like(p) * 0.1)
    return module.eval()


def test_whisper_encoder_forward_and_training_step(device):
    torch.manual_seed(0)
    ref = perturbed(WhisperEncoder(transformers.WhisperConfig(**TINY)), 0)
    weights = state_dict_numpy(ref)
    assert np.allclose(weights["embed_positions.weight"], sinusoids(10, 32), atol=1e-6)
    model = whisper_encoder(TINY, batch=2, weights=weights)
    x = np.random.default_rng(0).standard_normal((2, 8, 20))
    errors = check_forward(model, lambda input_features: ref.double()(input_features).last_hidden_state,
                           {"input_features": x}, device)
    print("forward", errors)
    labels = np.random.default_rng(1).standard_normal((2, 10, 32))
    # a key bias would be cancelled by softmax; Whisper has none, so every gradient is compared
    errors = check_training_step(
        model, ref, lambda m, ins, y: torch.nn.functional.mse_loss(m(ins["input_features"]).last_hidden_state, y),
        {"input_features": x}, labels, device)
    assert "embed_positions.weight" not in errors and "conv1.weight" in errors
    print("training step, worst (interpreter, gpu):", tuple(max(v[j] for v in errors.values()) for j in (0, 1)))


def test_whisper_model_state_dict_from_safetensors(tmp_path):
    torch.manual_seed(1)
    whole = transformers.WhisperModel(transformers.WhisperConfig(**TINY))
    perturbed(whole.encoder, 1)
    path = tmp_path / "whisper.safetensors"
    save_file({k: v.contiguous() for k, v in whole.state_dict().items()}, str(path))
    model = whisper_encoder(transformers.WhisperConfig(**TINY), weights=load_file(str(path)))
    assert "encoder.conv1.weight" in model.params and "encoder.embed_positions.weight" in model.graph.frozen
    x = np.random.default_rng(2).standard_normal((1, 8, 20))
    with torch.no_grad():
        want = whole.encoder.double()(torch.tensor(x)).last_hidden_state.numpy()
    got = run_graph(model.graph, {"input_features": x}, np.float64)[0]["last_hidden_state"]
    assert rel(got, want) < 1e-6


def test_whisper_tiny_encoder_compiles():
    t0 = time.perf_counter()
    model = whisper_encoder(whisper_tiny_encoder_config(), batch=1)
    t1 = time.perf_counter()
    package = compile_model(model, TrainConfig(loss="mse", optimizer="adamw"))
    t2 = time.perf_counter()
    n = sum(v.size for v in model.params.values())
    print(f"Whisper-tiny encoder 3000 frames: {n / 1e6:.2f} M params, build {t1 - t0:.2f} s, "
          f"compile {t2 - t1:.2f} s, package {len(package) / 2**20:.0f} MiB")
    assert model.graph.nodes[model.graph.outputs["last_hidden_state"]].shape == (1, 1500, 384)

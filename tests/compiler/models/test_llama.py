"""The Llama builder against transformers' LlamaForCausalLM (random initialisation,
float64 reference): forward with grouped-query heads and tied embeddings, one training
step with a cross-entropy over every token, untied heads, and a compile of SmolLM2-135M."""
import time
import types

import numpy as np
import torch
import transformers
from harness import check_forward, check_training_step, rel, state_dict_numpy
from meganeura.compiler import compile_model, run_graph
from meganeura.compiler.models.llama import llama, smollm2_135m_config
from meganeura.compiler.ir.training import TrainConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm

TINY = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}}


def _rms_norm_in_input_dtype(self, x):
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def reference(seed=0, **config):
    """A randomly initialised LlamaForCausalLM with non-trivial norm weights. Its RMS norms
    compute in float32 whatever the input dtype; here they keep float64 (the same math),
    so that the float64 reference is float64 throughout."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**config)
    m = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if "norm" in name else 0.05))
    for mod in m.modules():
        if isinstance(mod, LlamaRMSNorm):
            mod.forward = types.MethodType(_rms_norm_in_input_dtype, mod)
    return cfg, m


def test_llama_tied_gqa_forward_and_training_step(device):
    cfg, ref = reference(**TINY, tie_word_embeddings=True)
    weights = state_dict_numpy(ref)
    model = llama(cfg, batch=2, seq=9, weights=weights, flatten_logits=True)
    assert set(model.params) == set(weights) - {"lm_head.weight"}  # one matrix for embedding and head
    ids = np.random.default_rng(0).integers(0, 97, (2, 9)).astype(np.int32)
    errors = check_forward(model, lambda input_ids: ref.double()(input_ids).logits.reshape(-1, 97),
                           {"input_ids": ids}, device)
    print("forward", errors)
    labels = np.random.default_rng(1).integers(0, 97, 18)
    errors = check_training_step(
        model, ref, lambda m, ins, y: torch.nn.functional.cross_entropy(m(ins["input_ids"]).logits.reshape(-1, 97), y),
        {"input_ids": ids}, labels, device, loss="cross_entropy")
    print("training step, worst (interpreter, gpu):", tuple(max(v[j] for v in errors.values()) for j in (0, 1)))


def test_llama_untied_head_matches_in_the_interpreter():
    cfg, ref = reference(seed=1, **TINY, tie_word_embeddings=False)
    model = llama(cfg, batch=1, seq=7, weights=state_dict_numpy(ref))
    assert "lm_head.weight" in model.params
    ids = np.random.default_rng(2).integers(0, 97, (1, 7)).astype(np.int32)
    with torch.no_grad():
        want = ref.double()(torch.tensor(ids)).logits.numpy()
    got = run_graph(model.graph, {"input_ids": ids}, np.float64)[0]["logits"]
    assert rel(got, want) < 1e-6


def test_smollm2_135m_compiles():
    t0 = time.perf_counter()
    model = llama(smollm2_135m_config(), batch=1, seq=256)
    t1 = time.perf_counter()
    package = compile_model(model, TrainConfig(loss="mse", optimizer="adamw"))
    t2 = time.perf_counter()
    n = sum(v.size for v in model.params.values())
    print(f"SmolLM2-135M seq 256: {n / 1e6:.1f} M params, build {t1 - t0:.2f} s, compile {t2 - t1:.2f} s, "
          f"package {len(package) / 2**20:.0f} MiB")
    assert 134e6 < n < 135e6

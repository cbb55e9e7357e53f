"""Real architectures through the ONNX importer, against torch on the CPU.

Each model (transformers and diffusers with tiny random configs, and hand-written torch
modules in the style of torchvision's) is exported with the TorchScript exporter (opset 17)
or the dynamo exporter (its default opset), imported with load_onnx, compiled for inference
and for training, and run with Session on the default wgpu device. Measured:

- infer: the largest error of any output, relative to that output's largest magnitude,
  against the module in float64 in eval mode;
- train: three train_step losses against a float64 torch loop over the same weights and data
  with the same optimizer, as the largest relative difference. The module trains in train()
  mode (dropout is 0 in every config, so only batch norms change: they normalise with the
  batch's statistics, as the compiled step does).

    python tests/compiler/onnx_zoo.py [--only NAME] [--exporter torchscript|dynamo]
"""
from __future__ import annotations

import argparse
import copy
import io
import os
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

if not os.path.isdir(os.environ.get("XDG_RUNTIME_DIR", "")):  # before wgpu loads
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="meganeura-xdg-")

B = 2  # batch
STEPS = 3
EXPORTERS = ("torchscript", "dynamo")


@dataclass
class Case:
    """A model to export: the module, its inputs, and how it trains."""
    module: nn.Module
    inputs: dict  # name -> numpy array (float32 or int64)
    loss: str = "mse"  # or "cross_entropy" (output [B, classes])
    optimizer: str = "adamw"
    lr: float = 1e-2
    output: str | None = None  # which output the loss reads (None: the first)
    output_names: list = field(default_factory=lambda: ["y"])


class First(nn.Module):
    """The module's output `key` (a transformers/diffusers ModelOutput) as one tensor;
    `last`: only the last position of a [B, T, C] output."""

    def __init__(self, inner, key, last=False):
        super().__init__()
        self.inner, self.key, self.last = inner, key, last

    def forward(self, *args):
        out = self.inner(*args)
        out = out[self.key] if not isinstance(out, torch.Tensor) else out
        return out[:, -1, :] if self.last else out


def _rng(seed=0):
    return np.random.default_rng(seed)


def _ids(vocab, t=8, seed=1):
    return _rng(seed).integers(0, vocab, (B, t)).astype(np.int64)


def _image(c=3, h=32, w=32, seed=1):
    return _rng(seed).standard_normal((B, c, h, w)).astype(np.float32)


# ----------------------------------------------------------------- transformers, text
TEXT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _mask():
    m = np.ones((B, 8), np.int64)
    m[1, 6:] = 0
    return m


def bert():
    from transformers import BertConfig, BertForSequenceClassification
    m = BertForSequenceClassification(BertConfig(**TEXT, num_labels=5))
    return Case(First(m, "logits"), {"input_ids": _ids(100), "attention_mask": _mask()}, "cross_entropy")


def roberta():
    from transformers import RobertaConfig, RobertaForSequenceClassification
    m = RobertaForSequenceClassification(RobertaConfig(**TEXT, num_labels=5, pad_token_id=1))
    ids = _ids(100)
    ids[ids == 1] = 2
    return Case(First(m, "logits"), {"input_ids": ids, "attention_mask": _mask()}, "cross_entropy", "sgd")


def distilbert():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    cfg = DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64, dropout=0.0,
                           attention_dropout=0.0, seq_classif_dropout=0.0, max_position_embeddings=64, num_labels=5)
    m = DistilBertForSequenceClassification(cfg)
    return Case(First(m, "logits"), {"input_ids": _ids(100), "attention_mask": _mask()}, "cross_entropy")


def deberta_v2():
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification
    cfg = DebertaV2Config(**TEXT, num_labels=5, relative_attention=True, pos_att_type=["p2c", "c2p"],
                          position_buckets=8, max_relative_positions=16, pooler_dropout=0.0, type_vocab_size=0)
    m = DebertaV2ForSequenceClassification(cfg)
    return Case(First(m, "logits"), {"input_ids": _ids(100)}, "cross_entropy")


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    return Case(First(GPT2LMHeadModel(cfg), "logits", last=True), {"input_ids": _ids(100)}, "cross_entropy")


LLAMA = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    m = LlamaForCausalLM(LlamaConfig(**LLAMA))
    return Case(First(m, "logits", last=True), {"input_ids": _ids(100)}, "cross_entropy")


def mistral():
    from transformers import MistralConfig, MistralForCausalLM
    m = MistralForCausalLM(MistralConfig(**LLAMA, sliding_window=None))
    return Case(First(m, "logits", last=True), {"input_ids": _ids(100)}, "cross_entropy", "sgd")


def qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    m = Qwen2ForCausalLM(Qwen2Config(**LLAMA))
    return Case(First(m, "logits", last=True), {"input_ids": _ids(100)}, "cross_entropy")


def t5_encoder():
    from transformers import T5Config, T5EncoderModel
    cfg = T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16)
    return Case(First(T5EncoderModel(cfg), "last_hidden_state"), {"input_ids": _ids(100)})


# ----------------------------------------------------------------- transformers, vision
VIT = dict(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=5)


def vit():
    from transformers import ViTConfig, ViTForImageClassification
    return Case(First(ViTForImageClassification(ViTConfig(**VIT)), "logits"), {"pixel_values": _image()},
                "cross_entropy")


def deit():
    from transformers import DeiTConfig, DeiTForImageClassification
    return Case(First(DeiTForImageClassification(DeiTConfig(**VIT)), "logits"), {"pixel_values": _image()},
                "cross_entropy", "sgd")


SWIN = dict(image_size=32, patch_size=2, num_channels=3, embed_dim=16, depths=[2, 2], num_heads=[2, 4],
            window_size=4, mlp_ratio=2.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            drop_path_rate=0.0, num_labels=5)


def swin():
    from transformers import SwinConfig, SwinForImageClassification
    return Case(First(SwinForImageClassification(SwinConfig(**SWIN)), "logits"), {"pixel_values": _image()},
                "cross_entropy")


def swinv2():
    from transformers import Swinv2Config, Swinv2ForImageClassification
    return Case(First(Swinv2ForImageClassification(Swinv2Config(**SWIN)), "logits"), {"pixel_values": _image()},
                "cross_entropy")


def convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification
    cfg = ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, drop_path_rate=0.0,
                         num_labels=5, image_size=32)
    return Case(First(ConvNextForImageClassification(cfg), "logits"), {"pixel_values": _image()}, "cross_entropy")


def resnet():
    from transformers import ResNetConfig, ResNetForImageClassification
    cfg = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
                       num_labels=5)
    return Case(First(ResNetForImageClassification(cfg), "logits"), {"pixel_values": _image()}, "cross_entropy",
                "sgd")


def mobilenet_v2():
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    cfg = MobileNetV2Config(num_channels=3, image_size=32, depth_multiplier=0.25, min_depth=4,
                            classifier_dropout_prob=0.0, num_labels=5)
    return Case(First(MobileNetV2ForImageClassification(cfg), "logits"), {"pixel_values": _image()},
                "cross_entropy")


class SegmentWithClasses(nn.Module):
    """Segmentation logits and their int32 class map (ArgMax over classes)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        logits = self.inner(x).logits
        return logits, logits.argmax(1).to(torch.int32)


def segformer():
    from transformers import SegformerConfig, SegformerForSemanticSegmentation
    cfg = SegformerConfig(num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                          patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
                          drop_path_rate=0.0, decoder_hidden_size=16, num_labels=4)
    return Case(SegmentWithClasses(SegformerForSemanticSegmentation(cfg)), {"pixel_values": _image()},
                output="logits", output_names=["logits", "classes"])


# ----------------------------------------------------------------- transformers, audio, multimodal
def whisper_encoder():
    from transformers import WhisperConfig, WhisperModel
    cfg = WhisperConfig(vocab_size=100, num_mel_bins=16, d_model=32, encoder_layers=2, encoder_attention_heads=4,
                        encoder_ffn_dim=64, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=64,
                        max_source_positions=16, max_target_positions=16, dropout=0.0, attention_dropout=0.0,
                        activation_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        decoder_start_token_id=1)
    enc = WhisperModel(cfg).get_encoder()
    feats = _rng(1).standard_normal((B, 16, 32)).astype(np.float32)
    return Case(First(enc, "last_hidden_state"), {"input_features": feats})


def wav2vec2():
    from transformers import Wav2Vec2Config, Wav2Vec2Model
    cfg = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                         conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                         num_conv_pos_embedding_groups=4, apply_spec_augment=False, hidden_dropout=0.0,
                         attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0, layerdrop=0.0,
                         final_dropout=0.0)
    audio = _rng(1).standard_normal((B, 400)).astype(np.float32)
    return Case(First(Wav2Vec2Model(cfg), "last_hidden_state"), {"input_values": audio})


class ClipLogits(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, pixel_values):
        return self.inner(input_ids=input_ids, pixel_values=pixel_values).logits_per_image


def clip():
    from transformers import CLIPConfig, CLIPModel
    text = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=16, attention_dropout=0.0, eos_token_id=99)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                  patch_size=8, attention_dropout=0.0)
    m = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    return Case(ClipLogits(m), {"input_ids": _ids(100), "pixel_values": _image()}, "cross_entropy")


# ----------------------------------------------------------------- diffusers
def unet2d():
    from diffusers import UNet2DModel
    m = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, block_out_channels=(8, 16), layers_per_block=1,
                    norm_num_groups=4, attention_head_dim=4, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                    up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    t = np.array([10, 500], np.int64)
    return Case(First(m, "sample"), {"sample": _image(3, 16, 16), "timestep": t})


def unet2d_condition():
    from diffusers import UNet2DConditionModel
    m = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, block_out_channels=(8, 16),
                             layers_per_block=1, norm_num_groups=4, cross_attention_dim=8, attention_head_dim=2,
                             down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                             up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
    ctx = _rng(2).standard_normal((B, 5, 8)).astype(np.float32)
    t = np.array([10, 500], np.int64)
    return Case(First(m, "sample"), {"sample": _image(4, 8, 8), "timestep": t, "encoder_hidden_states": ctx})


# ----------------------------------------------------------------- recurrent
class RecurrentClassifier(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.rnn = cell(16, 24, batch_first=True)
        self.head = nn.Linear(24, 5)

    def forward(self, ids):
        out, _ = self.rnn(self.emb(ids))
        return self.head(out[:, -1])


def lstm():
    return Case(RecurrentClassifier(nn.LSTM), {"ids": _ids(50)}, "cross_entropy")


def gru():
    return Case(RecurrentClassifier(nn.GRU), {"ids": _ids(50)}, "cross_entropy", "sgd")


# ----------------------------------------------------------------- torchvision-style, hand-written
class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + idt)


class ResNet18(nn.Module):
    """torchvision's resnet18 layout (stem, max pool, 4 stages of 2 basic blocks), narrow."""

    def __init__(self, w=8, classes=5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, w, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], w
        for i, c in enumerate([w, 2 * w, 4 * w, 8 * w]):
            layers.append(nn.Sequential(BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)))
            cin = c
        self.layers = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.avgpool(self.layers(x)), 1))


class SqueezeExcite(nn.Module):
    def __init__(self, c, squeeze, gate):
        super().__init__()
        self.fc1, self.fc2, self.act, self.gate = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1), nn.ReLU(), gate

    def forward(self, x):
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


class InvertedResidual(nn.Module):
    def __init__(self, cin, mid, cout, k, stride, act, se, se_gate):
        super().__init__()
        layers = []
        if mid != cin:
            layers += [nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), act()]
        layers += [nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False), nn.BatchNorm2d(mid), act()]
        if se:
            layers.append(SqueezeExcite(mid, max(mid // 4, 4), se_gate))
        layers += [nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


class MobileNetV3(nn.Module):
    """torchvision's mobilenet_v3_small pattern: hardswish, squeeze-excite with hardsigmoid."""

    def __init__(self, classes=5):
        super().__init__()
        hs, re = nn.Hardswish, nn.ReLU
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), hs())
        self.blocks = nn.Sequential(
            InvertedResidual(8, 8, 8, 3, 2, re, True, nn.Hardsigmoid()),
            InvertedResidual(8, 24, 12, 3, 2, re, False, None),
            InvertedResidual(12, 32, 12, 5, 1, hs, True, nn.Hardsigmoid()))
        self.head = nn.Sequential(nn.Conv2d(12, 32, 1, bias=False), nn.BatchNorm2d(32), hs())
        self.classifier = nn.Sequential(nn.Linear(32, 24), hs(), nn.Dropout(0.0), nn.Linear(24, classes))

    def forward(self, x):
        x = self.head(self.blocks(self.stem(x)))
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class EfficientNet(nn.Module):
    """torchvision's efficientnet_b0 pattern: SiLU, depthwise MBConv, squeeze-excite with sigmoid,
    stochastic depth off."""

    def __init__(self, classes=5):
        super().__init__()
        si = nn.SiLU
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), si())
        self.blocks = nn.Sequential(
            InvertedResidual(8, 8, 8, 3, 1, si, True, nn.Sigmoid()),
            InvertedResidual(8, 32, 12, 3, 2, si, True, nn.Sigmoid()),
            InvertedResidual(12, 48, 12, 5, 1, si, True, nn.Sigmoid()))
        self.head = nn.Sequential(nn.Conv2d(12, 32, 1, bias=False), nn.BatchNorm2d(32), si())
        self.classifier = nn.Sequential(nn.Dropout(0.0), nn.Linear(32, classes))

    def forward(self, x):
        x = self.head(self.blocks(self.stem(x)))
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class ShiftedWindowBlock(nn.Module):
    """torchvision's swin_t block: LayerNorm, shifted-window attention with a relative position
    bias table and the shift mask, MLP."""

    def __init__(self, dim=16, heads=2, window=4, shift=2, size=8):
        super().__init__()
        self.dim, self.heads, self.window, self.shift, self.size = dim, heads, window, shift, size
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.bias_table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + window - 1
        self.register_buffer("rel_index", (rel[..., 0] * (2 * window - 1) + rel[..., 1]).flatten(), persistent=False)
        img = torch.zeros(size, size)
        cnt = 0
        for hs in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
            for ws in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
                img[hs, ws] = cnt
                cnt += 1
        wins = img.view(size // window, window, size // window, window).permute(0, 2, 1, 3).reshape(-1, window ** 2)
        mask = wins[:, None, :] - wins[:, :, None]
        self.register_buffer("mask", mask.ne(0).float() * -100.0, persistent=False)

    def attention(self, x):
        b, h, w, c = x.shape
        n, ws = self.window, self.window ** 2
        x = torch.roll(x, (-self.shift, -self.shift), (1, 2))
        x = x.view(b, h // n, n, w // n, n, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws, c)
        qkv = self.qkv(x).reshape(x.shape[0], ws, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0] * (c // self.heads) ** -0.5, qkv[1], qkv[2]
        attn = q @ k.transpose(-2, -1)
        bias = self.bias_table[self.rel_index].view(ws, ws, -1).permute(2, 0, 1)
        nw = self.mask.shape[0]
        attn = (attn + bias).view(b, nw, self.heads, ws, ws) + self.mask[None, :, None]
        attn = attn.view(-1, self.heads, ws, ws).softmax(-1)
        x = (attn @ v).transpose(1, 2).reshape(-1, ws, c)
        x = self.proj(x).view(b, h // n, w // n, n, n, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
        return torch.roll(x, (self.shift, self.shift), (1, 2))

    def forward(self, x):  # x: [B, H, W, C]
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def resnet18_tv():
    return Case(ResNet18(), {"x": _image()}, "cross_entropy", "sgd")


def mobilenet_v3_tv():
    return Case(MobileNetV3(), {"x": _image()}, "cross_entropy")


def efficientnet_tv():
    return Case(EfficientNet(), {"x": _image()}, "cross_entropy")


def swin_block_tv():
    return Case(ShiftedWindowBlock(), {"x": _rng(1).standard_normal((B, 8, 8, 16)).astype(np.float32)})


ZOO = {f.__name__: f for f in (
    bert, roberta, distilbert, deberta_v2, gpt2, llama, mistral, qwen2, t5_encoder,
    vit, deit, swin, swinv2, convnext, resnet, mobilenet_v2, segformer,
    whisper_encoder, wav2vec2, clip, unet2d, unet2d_condition, lstm, gru,
    resnet18_tv, mobilenet_v3_tv, efficientnet_tv, swin_block_tv)}


# ----------------------------------------------------------------- the measurement
def make_case(name, exporter="dynamo") -> Case:
    torch.manual_seed(0)
    case = ZOO[name]()
    inner = getattr(case.module, "inner", None)
    if exporter == "torchscript" and hasattr(inner, "set_attn_implementation"):
        inner.set_attn_implementation("eager")  # its SDPA conversion refuses grouped-query attention
    with torch.no_grad():  # no parameter exactly 0 or 1, as in a trained model: the dynamo
        for p in case.module.parameters():  # exporter drops a zero bias and an identity scale
            p.add_(torch.randn_like(p) * 0.05)
    for m in case.module.modules():  # batch norms with statistics other than the identity's
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    case.module.eval()
    return case


def export(case: Case, exporter: str) -> bytes:
    args = tuple(torch.from_numpy(v) for v in case.inputs.values())
    names = list(case.inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            f = io.BytesIO()
            torch.onnx.export(case.module, args, f, dynamo=False, opset_version=17, input_names=names,
                              output_names=case.output_names)
            return f.getvalue()
        prog = torch.onnx.export(case.module, args, dynamo=True, input_names=names,
                                 output_names=case.output_names, verbose=False)
        return prog.model_proto.SerializeToString()


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"shape {a.shape}, torch {b.shape}")
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _torch_args(case: Case):
    return tuple(torch.from_numpy(v.astype(np.float64) if v.dtype.kind == "f" else v) for v in case.inputs.values())


def torch_outputs(case: Case) -> list:
    ref = copy.deepcopy(case.module).double().eval()
    with torch.no_grad():
        out = ref(*_torch_args(case))
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def labels_for(case: Case, out: np.ndarray) -> np.ndarray:
    if case.loss == "cross_entropy":
        return _rng(7).integers(0, out.shape[1], out.shape[0]).astype(np.int64)
    return _rng(7).standard_normal(out.shape).astype(np.float32)


def torch_losses(case: Case, labels: np.ndarray, steps: int = STEPS, batch_stats: bool = False) -> list:
    """The losses of `steps` training steps of the float64 module, as the compiled step computes them:
    batch norms use the batch's statistics (train mode) with `batch_stats`, else their running ones."""
    m = copy.deepcopy(case.module).double().train(batch_stats)
    params = [p for p in m.parameters() if p.requires_grad]
    opt = (torch.optim.AdamW(params, lr=case.lr) if case.optimizer == "adamw"
           else torch.optim.SGD(params, lr=case.lr, momentum=0.9))
    at = case.output_names.index(case.output) if case.output else 0
    lab = torch.from_numpy(labels if case.loss == "cross_entropy" else labels.astype(np.float64))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        out = m(*_torch_args(case))
        out = out[at] if isinstance(out, tuple) else out
        loss = (nn.functional.cross_entropy(out, lab) if case.loss == "cross_entropy"
                else nn.functional.mse_loss(out, lab))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def run(name: str, exporter: str, steps: int = STEPS, device=None) -> dict:
    """Export, import, compile and run model `name`; returns the measured errors.

    Returns:
        {"infer": max relative error of the outputs, "train": max relative difference of the
        `steps` losses, "losses": (ours, torch), "seconds": ...}.
    """
    from meganeura.compiler import TrainConfig, compile_model
    from meganeura.compiler.onnx import load_onnx
    from meganeura.runtime import Package, Session

    t0 = time.perf_counter()
    case = make_case(name, exporter)
    data = export(case, exporter)
    model = load_onnx(data, batch_size=B)
    want = torch_outputs(case)
    session = Session(device, Package.from_bytes(compile_model(model)))
    feed = dict(zip(model.graph.inputs, case.inputs.values()))
    got = session.run("infer", feed)
    infer = max(rel(got[k], w) for k, w in zip(model.graph.outputs, want))
    result = {"infer": infer}
    if steps:
        out = case.output or next(iter(model.graph.outputs))
        cfg = TrainConfig(loss=case.loss, optimizer=case.optimizer, lr=case.lr, output=out)
        trainer = Session(device, Package.from_bytes(compile_model(model, cfg)))
        labels = labels_for(case, want[case.output_names.index(out) if case.output else 0])
        ours = [float(trainer.run("train_step", {**feed, "labels": labels})["loss"]) for _ in range(steps)]
        batch_stats = any(n.op == "batch_norm" for n in model.graph.nodes)
        theirs = torch_losses(case, labels, steps, batch_stats)
        result["step1"] = abs(ours[0] - theirs[0]) / max(abs(theirs[0]), 1e-30)
        result["train"] = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(ours, theirs))
        result["losses"] = (ours, theirs)
    result["seconds"] = time.perf_counter() - t0
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", help="a model name (repeatable)")
    ap.add_argument("--exporter", choices=EXPORTERS, action="append")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--trace", action="store_true", help="print the traceback of a failure")
    args = ap.parse_args(argv)
    names = args.only or list(ZOO)
    print(f"{'model':18} {'exporter':12} {'compiled':8} {'infer rel err':>13} {'step-1 loss':>11} {'3-step loss':>11} {'s':>5}  note")
    for name in names:
        for exporter in args.exporter or EXPORTERS:
            try:
                r = run(name, exporter, args.steps)
                s1, tr = (f"{r[k]:.1e}" if k in r else "-" for k in ("step1", "train"))
                print(f"{name:18} {exporter:12} {'yes':8} {r['infer']:13.1e} {s1:>11} {tr:>11} {r['seconds']:5.0f}",
                      flush=True)
            except Exception as exc:  # a row per failure: the table is the report
                msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:160]
                print(f"{name:18} {exporter:12} {'no':8} {'-':>13} {'-':>11} {'-':>11} {'':5}  {msg}", flush=True)
                if args.trace:
                    traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())

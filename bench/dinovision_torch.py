"""The DinoVision model in plain PyTorch (no transformers needed), loading the same weights
by the same names: the side of the benchmark that runs on PyTorch eager, and a second
implementation the tests compare meganeura's package against."""
from __future__ import annotations

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, d, heads, mlp, eps):
        super().__init__()
        self.heads, self.eps = heads, eps
        self.norm1 = torch.nn.LayerNorm(d, eps=eps)
        self.attention = torch.nn.Module()
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self.attention, n, torch.nn.Linear(d, d))
        self.layer_scale1 = torch.nn.Module()
        self.layer_scale1.lambda1 = torch.nn.Parameter(torch.ones(d))
        self.norm2 = torch.nn.LayerNorm(d, eps=eps)
        self.mlp = torch.nn.Module()
        self.mlp.fc1, self.mlp.fc2 = torch.nn.Linear(d, mlp), torch.nn.Linear(mlp, d)
        self.layer_scale2 = torch.nn.Module()
        self.layer_scale2.lambda1 = torch.nn.Parameter(torch.ones(d))

    def forward(self, h):
        b, t, d = h.shape
        a = self.norm1(h)
        q, k, v = (getattr(self.attention, n)(a).view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for n in ("q_proj", "k_proj", "v_proj"))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        h = h + self.attention.o_proj(a) * self.layer_scale1.lambda1
        m = self.mlp.fc2(F.gelu(self.mlp.fc1(self.norm2(h))))
        return h + m * self.layer_scale2.lambda1


class DinoVisionTorch(torch.nn.Module):
    def __init__(self, cfg):  # cfg: demos.dinovision.model.DemoConfig
        super().__init__()
        bb = cfg.backbone
        d, self.cfg = bb.hidden_size, cfg
        self.embeddings = torch.nn.Module()
        self.embeddings.patch_embeddings = torch.nn.Module()
        self.embeddings.patch_embeddings.projection = torch.nn.Conv2d(3, d, bb.patch_size, bb.patch_size)
        self.embeddings.cls_token = torch.nn.Parameter(torch.zeros(1, 1, d))
        self.embeddings.mask_token = torch.nn.Parameter(torch.zeros(1, d))
        grid = bb.image_size // bb.patch_size
        self.embeddings.position_embeddings = torch.nn.Parameter(torch.zeros(1, grid * grid + 1, d))
        self.encoder = torch.nn.Module()
        self.encoder.layer = torch.nn.ModuleList(
            Block(d, bb.num_attention_heads, int(d * bb.mlp_ratio), bb.layer_norm_eps) for _ in range(bb.num_hidden_layers))
        self.layernorm = torch.nn.LayerNorm(d, eps=bb.layer_norm_eps)
        c, hdn, r = cfg.classes, cfg.decoder_hidden, cfg.refine_channels
        self.decoder = torch.nn.Module()
        self.decoder.norm = torch.nn.LayerNorm(d, eps=1e-6)
        self.decoder.fc1, self.decoder.fc2 = torch.nn.Linear(d, hdn), torch.nn.Linear(hdn, c)
        self.decoder.refine1 = torch.nn.Conv2d(c + 3, r, 3, padding=1)
        self.decoder.refine2 = torch.nn.Conv2d(r, c, 3, padding=1)

    def features(self, x):
        bb = self.cfg.backbone
        b, _, h, w = x.shape
        gh, gw = h // bb.patch_size, w // bb.patch_size
        p = self.embeddings.patch_embeddings.projection(x).flatten(2).transpose(1, 2)
        h0 = torch.cat([self.embeddings.cls_token.expand(b, -1, -1), p], 1)
        pos = self.embeddings.position_embeddings
        grid = bb.image_size // bb.patch_size
        if not (gh * gw == grid * grid and h == w):
            table = pos[:, 1:].reshape(1, grid, grid, -1).permute(0, 3, 1, 2)
            table = F.interpolate(table, size=(gh, gw), mode="bicubic", align_corners=False)
            pos = torch.cat([pos[:, :1], table.permute(0, 2, 3, 1).reshape(1, gh * gw, -1)], 1)
        hid = h0 + pos
        for blk in self.encoder.layer:
            hid = blk(hid)
        return self.layernorm(hid)[:, 1:]

    def decode(self, feats, pixels):
        b = feats.shape[0]
        gh, gw = self.cfg.grid
        x = self.decoder.fc2(F.gelu(self.decoder.fc1(self.decoder.norm(feats))))
        x = x.view(b, gh, gw, -1).permute(0, 3, 1, 2)
        up = F.interpolate(x, size=pixels.shape[2:], mode="bilinear", align_corners=False)
        r = F.relu(self.decoder.refine1(torch.cat([up, pixels], 1)))
        return up + self.decoder.refine2(r)

    def forward(self, x):
        return self.decode(self.features(x), x)


def load(cfg, weights: dict, device="cpu", dtype=torch.float32) -> DinoVisionTorch:
    m = DinoVisionTorch(cfg)
    state = m.state_dict()
    missing = [k for k in state if k not in weights and k != "embeddings.mask_token"]
    if missing:
        raise KeyError(f"weights lack {missing[:5]}")
    m.load_state_dict({k: torch.as_tensor(weights[k]) if k in weights else v for k, v in state.items()})
    return m.to(device=device, dtype=dtype)

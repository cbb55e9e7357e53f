"""A multi-layer perceptron: Linear layers with ReLU between them."""
from __future__ import annotations

import numpy as np

from ..ir.builder import Builder, Model


def mlp(sizes, batch: int = 64, weights: dict | None = None, names=None, activation: str = "relu",
        seed: int = 0) -> Model:
    """sizes [in, hidden..., out]; layer i's parameters are `{names[i]}.weight` / `.bias`
    (default "fc1", "fc2", ...), in PyTorch's [out, in] layout."""
    rng = np.random.default_rng(seed)
    names = names or [f"fc{i + 1}" for i in range(len(sizes) - 1)]
    b = Builder()
    h = b.input("x", (batch, sizes[0]))
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        bound = 1 / np.sqrt(n_in)  # PyTorch's default Linear initialisation range
        w = (weights or {}).get(f"{names[i]}.weight", rng.uniform(-bound, bound, (n_out, n_in)))
        bias = (weights or {}).get(f"{names[i]}.bias", rng.uniform(-bound, bound, n_out))
        h = b.linear(h, b.param(f"{names[i]}.weight", w), b.param(f"{names[i]}.bias", bias))
        if i < len(sizes) - 2:
            h = b.op(activation, h)
    b.output("logits", h)
    return b.build()

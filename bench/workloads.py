"""Benchmark workloads: each returns (model, train config or None, inputs, torch_setup)
where torch_setup() -> (infer fn, train-step fn) running the same computation in PyTorch
on CUDA (fp32), with the same weights."""
from __future__ import annotations

import numpy as np


def _gemm(m, k, n):
    def spec():
        import torch

        from meganeura.compiler import Builder

        rng = np.random.default_rng(0)
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        b = Builder()
        x = b.input("a", (m, k))
        b.output("c", b.matmul(x, b.param("w", w)))

        def setup():
            ta, tw = torch.tensor(a, device="cuda"), torch.tensor(w, device="cuda")
            return (lambda: ta @ tw), None
        return b.build(), None, {"a": a}, setup
    return spec


def _mlp(batch, sizes):
    def spec():
        import torch

        from meganeura.compiler import TrainConfig
        from meganeura.compiler.models.mlp import mlp

        torch.manual_seed(0)
        layers = []
        for i, (a, b_) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(torch.nn.Linear(a, b_))
            if i < len(sizes) - 2:
                layers.append(torch.nn.ReLU())
        tm = torch.nn.Sequential(*layers)
        names = [str(i) for i in range(0, 2 * len(sizes) - 2, 2)]
        weights = {k: v.numpy() for k, v in tm.state_dict().items()}
        model = mlp(list(sizes), batch=batch, weights=weights, names=names)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
        y = rng.integers(0, sizes[-1], batch)

        def setup():
            tmc = tm.cuda()
            opt = torch.optim.AdamW(tmc.parameters(), lr=1e-3)
            tx, ty = torch.tensor(x, device="cuda"), torch.tensor(y, device="cuda")

            def infer():
                with torch.no_grad():
                    return tmc(tx)

            def train():
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(tmc(tx), ty).backward()
                opt.step()
            return infer, train
        return model, TrainConfig(loss="cross_entropy", optimizer="adamw", lr=1e-3), {"x": x, "labels": y}, setup
    return spec


WORKLOADS = {
    "gemm_257x384x1152": _gemm(257, 384, 1152),
    "gemm_257x1536x384": _gemm(257, 1536, 384),
    "gemm_1024^3": _gemm(1024, 1024, 1024),
    "gemm_4096^3": _gemm(4096, 4096, 4096),
    "mlp_64-128-10_b64": _mlp(64, (64, 128, 10)),
    "mlp_784-512-512-10_b256": _mlp(256, (784, 512, 512, 10)),
}

"""Benchmark workloads. WORKLOADS maps a name to spec(smoke=False) -> Case: the meganeura
model, its training configuration (or None), the inputs (training's "labels" among them),
and setup(torch_device) -> (infer, train_step): PyTorch functions running the same
computation with the same weights (fp32). infer() returns the output that meganeura's
infer program's `output` is checked against; train_step() returns the loss tensor (or
train_step is None). setup returns a TorchSide: that pair, with the pieces it is made of
(forward, loss, optimizer, set_mode) from which bench/torch_paths.py makes PyTorch's fast
paths (TF32, bf16 autocast, torch.compile, CUDA graphs). `smoke` asks for a tiny configuration that lavapipe and a CPU torch
run in seconds. bench/models.py adds the paper's five models and DINOv2."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Case:
    model: object  # meganeura.compiler Model
    train: object | None  # TrainConfig
    inputs: dict
    setup: Callable  # torch device -> (infer, train_step or None)
    output: str | None = None  # the output checked against torch's; default the only one
    paper: bool = False  # one of the paper's five workloads (the summary's population)
    config: str = ""  # what was built, for the table
    notes: dict = field(default_factory=dict)  # filled by setup: torch-side details (attention, AdamW)
    torch_variants: Callable | None = None  # cuda device -> {name: (infer fn, seconds to make it)}


class TorchSide(tuple):
    """What a Case's setup(device) returns: the pair (infer, train_step), which unpacks as a
    pair, and its pieces: forward() -> output (no mode switch; autograd as the caller has it),
    loss(output) -> loss tensor, the optimizer, and set_mode(training) (the module's train() /
    eval(), switched only when the mode changes). loss and optimizer are None without training."""

    def __new__(cls, infer, train, forward=None, loss=None, optimizer=None, set_mode=None):
        self = super().__new__(cls, (infer, train))
        self.forward, self.loss, self.optimizer = forward, loss, optimizer
        self.set_mode = set_mode or (lambda training: None)
        return self


def module_side(module, forward, loss=None, optimizer=None) -> TorchSide:
    """infer and train_step of `module` from forward() -> output and loss(output) -> loss: the
    module switches between eval() (infer) and train() (training step) only when the mode
    changes, so the timed loops never pay for it."""
    import torch

    mode = [None]

    def set_mode(training):
        if mode[0] != training:
            module.train(training)
            mode[0] = training

    def infer():
        set_mode(False)
        with torch.no_grad():
            return forward()

    def train():
        set_mode(True)
        optimizer.zero_grad(set_to_none=True)
        value = loss(forward())
        value.backward()
        optimizer.step()
        return value
    return TorchSide(infer, train if loss is not None else None, forward, loss, optimizer, set_mode)


def _gemm(m, k, n):
    def spec(smoke=False):
        import torch
        from meganeura.compiler import Builder

        mm, kk, nn = (min(v, 96) for v in (m, k, n)) if smoke else (m, k, n)
        rng = np.random.default_rng(0)
        a = rng.standard_normal((mm, kk)).astype(np.float32)
        w = rng.standard_normal((kk, nn)).astype(np.float32)
        b = Builder()
        x = b.input("a", (mm, kk))
        b.output("c", b.matmul(x, b.param("w", w)))

        def setup(dev):
            ta, tw = torch.tensor(a, device=dev), torch.tensor(w, device=dev)

            def forward():
                return ta @ tw
            return TorchSide(forward, None, forward)
        return Case(b.build(), None, {"a": a}, setup, config=f"{mm}x{kk}x{nn}")
    return spec


def _mlp(batch, sizes):
    def spec(smoke=False):
        import torch
        from meganeura.compiler import TrainConfig
        from meganeura.compiler.models.mlp import mlp

        n = min(batch, 16) if smoke else batch
        torch.manual_seed(0)
        layers = []
        for i, (a, b_) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(torch.nn.Linear(a, b_))
            if i < len(sizes) - 2:
                layers.append(torch.nn.ReLU())
        tm = torch.nn.Sequential(*layers)
        names = [str(i) for i in range(0, 2 * len(sizes) - 2, 2)]
        weights = {k: v.numpy() for k, v in tm.state_dict().items()}
        model = mlp(list(sizes), batch=n, weights=weights, names=names)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((n, sizes[0])).astype(np.float32)
        y = rng.integers(0, sizes[-1], n)

        def setup(dev):
            tmc = tm.to(dev)
            opt = torch.optim.AdamW(tmc.parameters(), lr=1e-3)
            tx, ty = torch.tensor(x, device=dev), torch.tensor(y, device=dev)
            return module_side(tmc, lambda: tmc(tx), lambda out: torch.nn.functional.cross_entropy(out, ty), opt)
        return Case(model, TrainConfig(loss="cross_entropy", optimizer="adamw", lr=1e-3), {"x": x, "labels": y}, setup,
                    config=f"{'-'.join(map(str, sizes))}, batch {n}")
    return spec


WORKLOADS = {
    "gemm_257x384x1152": _gemm(257, 384, 1152),
    "gemm_257x1536x384": _gemm(257, 1536, 384),
    "gemm_1024^3": _gemm(1024, 1024, 1024),
    "gemm_4096^3": _gemm(4096, 4096, 4096),
    "mlp_64-128-10_b64": _mlp(64, (64, 128, 10)),
    "mlp_784-512-512-10_b256": _mlp(256, (784, 512, 512, 10)),
}

"""The MLP builder against torch.nn.Sequential(Linear, ReLU, Linear)."""
import numpy as np
import torch

from harness import check_forward, check_training_step, state_dict_numpy
from meganeura.compiler.models.mlp import mlp


def test_mlp_forward_and_training_step(device):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(10, 33), torch.nn.ReLU(), torch.nn.Linear(33, 4))
    model = mlp([10, 33, 4], batch=6, weights=state_dict_numpy(ref), names=["0", "2"])
    x = np.random.default_rng(0).standard_normal((6, 10))
    check_forward(model, lambda x: ref.double()(x), {"x": x}, device)
    labels = np.array([0, 3, 1, 1, 2, 0])
    check_training_step(model, ref, lambda m, ins, y: torch.nn.functional.cross_entropy(m(ins["x"]), y),
                        {"x": x}, labels, device, loss="cross_entropy")

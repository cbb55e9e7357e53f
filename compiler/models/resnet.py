"""ResNet (He et al. 2015) with torchvision's layout: `resnet18`, `resnet50`, and the
shared `resnet(block, layers, ...)`.

Parameter names are torchvision's state_dict names (conv1.weight, bn1.*, layer1.0.conv1.weight,
layer1.0.downsample.0.weight, layer1.0.downsample.1.*, ..., fc.weight, fc.bias), so a
torchvision checkpoint loads by name. Batch-norm running statistics are parameters marked
frozen: the infer program uses them (eval mode); a training step normalises with the batch's
statistics and updates them (ir/training.py's train_mode, as torch's train()).
Bottleneck blocks stride in their 3x3 convolution (torchvision's "ResNet v1.5").
"""
from __future__ import annotations

import numpy as np

from ..ir.builder import Builder, Model

BASIC, BOTTLENECK = "basic", "bottleneck"
EXPANSION = {BASIC: 1, BOTTLENECK: 4}


class _Init:
    """Weights from the state_dict when given, else torchvision's initialisation."""

    def __init__(self, b: Builder, weights: dict | None, seed: int):
        self.b, self.w, self.rng = b, weights, np.random.default_rng(seed)

    def _get(self, name, make):
        if self.w is not None:
            if name not in self.w:
                raise KeyError(f"weights lack {name!r}")
            return self.w[name]
        return make()

    def param(self, name, make, frozen=False):
        return self.b.param(name, self._get(name, make), frozen=frozen)

    def conv(self, name, c_out, c_in, k):
        # kaiming_normal_(mode="fan_out", nonlinearity="relu")
        std = np.sqrt(2.0 / (c_out * k * k))
        return self.param(f"{name}.weight", lambda: self.rng.standard_normal((c_out, c_in, k, k), np.float32) * std)

    def bn(self, name, c):
        return (self.param(f"{name}.weight", lambda: np.ones(c, np.float32)),
                self.param(f"{name}.bias", lambda: np.zeros(c, np.float32)),
                self.param(f"{name}.running_mean", lambda: np.zeros(c, np.float32), frozen=True),
                self.param(f"{name}.running_var", lambda: np.ones(c, np.float32), frozen=True))


def _conv_bn(b, init, x, name_conv, name_bn, c_out, k, stride=1, relu=True):
    w = init.conv(name_conv, c_out, x.shape[1], k)
    p = k // 2
    y = b.conv2d(x, w, stride=(stride, stride), padding=(p, p, p, p), dilation=(1, 1), groups=1)
    y = b.batch_norm(y, *init.bn(name_bn, c_out), eps=1e-5, momentum=0.1)
    return b.relu(y) if relu else y


def _block(b, init, x, name, kind, planes, stride):
    c_in = x.shape[1]
    c_out = planes * EXPANSION[kind]
    if kind == BASIC:
        h = _conv_bn(b, init, x, f"{name}.conv1", f"{name}.bn1", planes, 3, stride)
        h = _conv_bn(b, init, h, f"{name}.conv2", f"{name}.bn2", planes, 3, 1, relu=False)
    else:
        h = _conv_bn(b, init, x, f"{name}.conv1", f"{name}.bn1", planes, 1)
        h = _conv_bn(b, init, h, f"{name}.conv2", f"{name}.bn2", planes, 3, stride)
        h = _conv_bn(b, init, h, f"{name}.conv3", f"{name}.bn3", c_out, 1, relu=False)
    if stride != 1 or c_in != c_out:
        x = _conv_bn(b, init, x, f"{name}.downsample.0", f"{name}.downsample.1", c_out, 1, stride, relu=False)
    return b.relu(h + x)


def resnet(block: str, layers, batch: int = 1, image_size: int = 224, num_classes: int = 1000, width: int = 64,
           weights: dict | None = None, seed: int = 0) -> Model:
    """Input "x" [batch, 3, image_size, image_size]; output "logits" [batch, num_classes].

    block: "basic" (ResNet-18/34) or "bottleneck" (ResNet-50/101/152); layers: blocks per
    stage; width: the first stage's channels (64 in the real models)."""
    if block not in EXPANSION:
        raise ValueError(f"block is 'basic' or 'bottleneck', not {block!r}")
    b = Builder()
    init = _Init(b, weights, seed)
    x = b.input("x", (batch, 3, image_size, image_size))
    h = _conv_bn(b, init, x, "conv1", "bn1", width, 7, 2)
    h = b.max_pool2d(h, kernel=(3, 3), stride=(2, 2), padding=(1, 1, 1, 1), ceil_mode=False)
    for stage, n_blocks in enumerate(layers):
        planes = width * 2 ** stage
        for i in range(n_blocks):
            stride = 2 if stage > 0 and i == 0 else 1
            h = _block(b, init, h, f"layer{stage + 1}.{i}", block, planes, stride)
    h = b.mean(h, (2, 3))  # adaptive average pool to 1x1, flattened
    n_in = h.shape[1]
    bound = 1 / np.sqrt(n_in)  # torch.nn.Linear's default initialisation
    fc_w = init.param("fc.weight", lambda: init.rng.uniform(-bound, bound, (num_classes, n_in)))
    fc_b = init.param("fc.bias", lambda: init.rng.uniform(-bound, bound, num_classes))
    b.output("logits", b.linear(h, fc_w, fc_b))
    return b.build()


def resnet18(batch: int = 1, image_size: int = 224, num_classes: int = 1000, width: int = 64,
             weights: dict | None = None, seed: int = 0) -> Model:
    return resnet(BASIC, (2, 2, 2, 2), batch, image_size, num_classes, width, weights, seed)


def resnet50(batch: int = 1, image_size: int = 224, num_classes: int = 1000, width: int = 64,
             weights: dict | None = None, seed: int = 0) -> Model:
    return resnet(BOTTLENECK, (3, 4, 6, 3), batch, image_size, num_classes, width, weights, seed)

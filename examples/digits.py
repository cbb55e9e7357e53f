"""Digits, end to end: a PyTorch MLP exported to ONNX, compiled with `meganeura compile
--train`, trained on the GPU with Session.run("train_step"), evaluated with "infer".

    python examples/digits.py [--epochs 20] [--out DIR]
"""
from __future__ import annotations

import argparse
import warnings
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BATCH = 64


def load_data(seed: int = 0):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    return train_test_split(x, d.target.astype(np.int64), test_size=0.2, random_state=seed, stratify=d.target)


def export_mlp(path: Path, seed: int = 0):
    """The PyTorch model, exported to ONNX with a dynamic batch dimension."""
    import torch

    warnings.filterwarnings("ignore", category=DeprecationWarning)  # the TorchScript exporter's notice
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    torch.onnx.export(model, (torch.zeros(BATCH, 64),), str(path), input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17, dynamo=False)
    return model


def compile_package(onnx_path: Path, out: Path, lr: float = 0.003):
    exe = Path(sys.executable).with_name("meganeura")
    cmd = [str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else ["-m", "meganeura.compiler.cli"]),
           "compile", str(onnx_path), "-o", str(out), "--train", "--loss", "cross_entropy",
           "--optimizer", "adamw", "--lr", str(lr)]
    subprocess.run(cmd, check=True)


def train(session, x, y, epochs: int, seed: int = 0, log=print):
    rng = np.random.default_rng(seed)
    losses = []
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        total, count = 0.0, 0
        for s in range(0, len(x), BATCH):  # the last, partial batch is padded and masked
            idx = order[s:s + BATCH]
            loss = float(session.run("train_step", {"x": x[idx], "labels": y[idx]})["loss"])
            total, count = total + loss * len(idx), count + len(idx)
        losses.append(total / count)
        log(f"epoch {epoch + 1:2d}: loss {losses[-1]:.4f}")
    return losses


def accuracy(session, x, y) -> float:
    logits = session.run("infer", {"x": x})["logits"]
    return float((logits.argmax(1) == y).mean())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--out", default="out/digits")
    args = ap.parse_args(argv)
    from meganeura.runtime import Session

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    xtr, xte, ytr, yte = load_data()
    export_mlp(out / "mlp.onnx")
    t = time.perf_counter()
    compile_package(out / "mlp.onnx", out / "mlp.mnpk")
    print(f"compiled in {time.perf_counter() - t:.2f} s (including Python start-up)")
    session = Session(None, out / "mlp.mnpk")
    print(f"device: {session.device.adapter.info['device']}")
    print(f"before training: test accuracy {accuracy(session, xte, yte):.3f}")
    t = time.perf_counter()
    train(session, xtr, ytr, args.epochs)
    print(f"trained {args.epochs} epochs in {time.perf_counter() - t:.1f} s")
    acc = accuracy(session, xte, yte)
    session.save_weights(out / "mlp.safetensors")
    print(f"test accuracy {acc:.3f} on {len(yte)} held-out digits; weights in {out / 'mlp.safetensors'}")
    return acc


if __name__ == "__main__":
    main()

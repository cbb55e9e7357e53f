"""Compile time of every full-size configuration (random weights), inference and a whole
AdamW training step, split into graph work and package writing. CPU only.

    python bench/compile_times.py [--only NAME ...] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def workloads():
    from meganeura.compiler import TrainConfig
    from meganeura.compiler.models import dinov2, llama, mlp, resnet, unet, whisper

    mse = TrainConfig(loss="mse", optimizer="adamw")
    ce = TrainConfig(loss="cross_entropy", optimizer="adamw")
    yield "MLP 64-128-10 (b64)", lambda: mlp.mlp([64, 128, 10], batch=64), ce
    yield "ResNet-18 224 (b1)", lambda: resnet.resnet18(batch=1), ce
    yield "ResNet-50 224 (b1)", lambda: resnet.resnet50(batch=1), ce
    yield "DINOv2 ViT-S/14 224 (b1)", lambda: dinov2.dinov2(dinov2.dinov2_vits14_config()), mse
    yield "Whisper-tiny encoder 3000 frames", lambda: whisper.whisper_encoder(whisper.whisper_tiny_encoder_config()), mse
    yield "SmolLM2-135M seq 256", lambda: llama.llama(llama.smollm2_135m_config(), seq=256), mse
    try:
        from meganeura.compiler.models import smolvla

        yield "SmolVLA action expert", lambda: smolvla.smolvla_expert(smolvla.smolvla_expert_config()), mse
    except (ImportError, AttributeError):
        pass
    yield "SD-1.5 U-Net 64x64 latent", lambda: unet.unet(unet.full_size_config()), mse


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--out", default="out/bench")
    args = ap.parse_args(argv)
    from meganeura.compiler import compile_model

    rows = []
    for name, build, train in workloads():
        if args.only and not any(o.lower() in name.lower() for o in args.only):
            continue
        t = time.perf_counter()
        model = build()
        built = time.perf_counter() - t
        marks = {}
        t = time.perf_counter()
        data = compile_model(model, train, progress=lambda stage: marks.setdefault(stage, time.perf_counter()))
        total = time.perf_counter() - t
        write = time.perf_counter() - marks.get("write package", time.perf_counter())
        params = sum(v.size for v in model.params.values())
        rows.append({"model": name, "parameters": int(params), "build_s": built, "compile_s": total,
                     "graph_s": total - write, "write_s": write, "package_mb": len(data) / 2**20})
        print(f"{name:34s} {params / 1e6:8.1f} M params  compile {total:6.2f} s "
              f"(graph {total - write:5.2f} s, writing {write:5.2f} s)  {len(data) / 2**20:8.1f} MiB", flush=True)
        del model, data
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compile_times.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""What a compiled package asks of the GPU, per full-size workload, without a GPU:
distinct kernels (pipelines made at load), dispatches per program, buffer bytes.

    python bench/plan_stats.py [--only NAME ...] [--share-scratch]

The training configurations are bench/run.py's (ResNet-50 batch 16, SmolLM2 4 x 128).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def workloads():
    from meganeura.compiler import TrainConfig
    from meganeura.compiler.models import dinov2, llama, resnet, smolvla, unet, whisper

    mse, ce = TrainConfig(loss="mse"), TrainConfig(loss="cross_entropy")
    yield "DINOv2 ViT-S/14 224 b1", lambda: dinov2.dinov2(dinov2.dinov2_vits14_config()), mse
    yield "ResNet-50 224 b16", lambda: resnet.resnet50(batch=16), ce
    yield "SmolLM2-135M 4x128", lambda: llama.llama(llama.smollm2_135m_config(), batch=4, seq=128, flatten_logits=True), ce
    yield "Whisper-tiny encoder", lambda: whisper.whisper_encoder(whisper.whisper_tiny_encoder_config()), mse
    yield "SD-1.5 U-Net 64x64", lambda: unet.unet(unet.full_size_config()), mse
    yield "SmolVLA action expert", lambda: smolvla.smolvla_expert(smolvla.smolvla_expert_config()), mse


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--share-scratch", action="store_true", help="infer and train_step share scratch buffers")
    args = ap.parse_args(argv)
    from meganeura.compiler import compile_model
    from meganeura.runtime import Package

    print("| workload | distinct kernels | infer dispatches | train dispatches | buffers MiB | train scratch peak MiB |")
    print("|---|---|---|---|---|---|")
    for name, build, train in workloads():
        if args.only and not any(o.lower() in name.lower() for o in args.only):
            continue
        m = Package.from_bytes(compile_model(build(), train, share_scratch=args.share_scratch)).manifest
        p = m["programs"]
        print(f"| {name} | {len(m['kernels'])} | {len(p['infer']['dispatches'])} | {len(p['train_step']['dispatches'])} | "
              f"{m['memory']['buffer_bytes'] / 2**20:.0f} | {p['train_step']['scratch_peak_bytes'] / 2**20:.0f} |", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()

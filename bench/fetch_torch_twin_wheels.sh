#!/usr/bin/env bash
# The GPU machine has torch but no transformers/diffusers and no network. bench/models.py's
# PyTorch twins need them: download cp312 wheels here into .device/hf (carried with .device),
# then on the device: python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/hf/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .device/hf
.venv/bin/python -m pip download --no-deps -q -d .device/hf --python-version 3.12 --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
  transformers==5.24.0 diffusers==0.42.1 huggingface_hub==2.4.0 tokenizers==0.23.3 regex==2026.11.19 \
  pyyaml==6.0.4 tqdm==4.70.1 typer click rich shellingham markdown-it-py mdurl pygments hf-xet==1.8.0 \
  importlib_metadata zipp requests urllib3 idna certifi charset-normalizer pillow httpx2 httpcore2 truststore \
  anyio h11 httpcore sniffio
ls .device/hf | wc -l

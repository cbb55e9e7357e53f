#!/usr/bin/env bash
# Run the main job, the DinoVision demo (windowed when a display exists, headless
# otherwise): sets up .venv (see scripts/setup.sh) first; extra args go to the demo.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
if [ -f demos/dinovision/__main__.py ]; then
    exec .venv/bin/python -m demos.dinovision "$@"
elif [ -f examples/digits.py ]; then
    exec .venv/bin/python examples/digits.py "$@"
else
    echo "demo.sh: no demo yet (expected demos/dinovision/__main__.py or examples/digits.py)" >&2
    exit 1
fi

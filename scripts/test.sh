#!/usr/bin/env bash
# Run the tests: sets up .venv (see scripts/setup.sh), then pytest; extra args go to pytest.
#   bash scripts/test.sh                  # everything
#   bash scripts/test.sh tests/compiler -x
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
# two workers (pytest-xdist), a file to each at a time: module fixtures run once
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile tests "$@"

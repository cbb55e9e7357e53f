#!/usr/bin/env bash
# Build the documentation site into site/ with warnings as errors (mkdocs.yml has strict: true).
#   bash scripts/docs.sh            # build
#   bash scripts/docs.sh serve      # live preview on http://127.0.0.1:8000
# Installs pyproject.toml's `docs` extra into .venv/ when it is missing (scripts/setup.sh
# installs it too). The benchmark plots are committed; bench/plot_results.py remakes them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="${PYTHON:-python3}"
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
    echo "[docs] creating .venv"
    "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import mkdocs, material, mkdocstrings_handlers.python, matplotlib' 2>/dev/null; then
    echo "[docs] installing the docs extra into .venv"
    # the extra's requirements alone: the site reads the sources, it never imports meganeura
    mapfile -t reqs < <("$VENV/bin/python" - <<'PYEOF'
import re  # (tomllib is Python 3.11+)
extra = re.search(r"^docs = \[(.*?)^\]", open("pyproject.toml").read(), re.S | re.M).group(1)
print("\n".join(re.findall(r'"([^"]+)"', extra)))
PYEOF
)
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${reqs[@]}"
fi

export NO_MKDOCS_2_WARNING=1  # (a banner about Material's successor, printed on every build)
if [ "${1:-}" = serve ]; then
    shift
    exec "$VENV/bin/mkdocs" serve "$@"
fi
exec "$VENV/bin/mkdocs" build --strict -d site "$@"

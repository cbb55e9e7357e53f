#!/usr/bin/env bash
# Prepare this checkout: .venv/ with meganeura installed editable (extras test,demo,docs),
# a Vulkan driver (Mesa lavapipe when the machine has no GPU driver) and Xvfb.
#
#   bash scripts/setup.sh      # just set up
#   source scripts/setup.sh    # set up, and also export XDG_RUNTIME_DIR into this shell
#
# Idempotent: a second run only checks a stamp (a hash of pyproject.toml and setup.py)
# and the system packages, and returns within a second or two.
# On a machine without the system packages, run it as root (it uses apt-get), or install
# them yourself: mesa-vulkan-drivers libvulkan1 xvfb (and python3-venv on Debian/Ubuntu).

_mn_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# wgpu-native (through the Vulkan loader) wants XDG_RUNTIME_DIR to be an existing folder.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "${XDG_RUNTIME_DIR}" ]; then
    XDG_RUNTIME_DIR="/tmp/meganeura-runtime-$(id -u)"
    mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi
export XDG_RUNTIME_DIR

# The work runs in a subshell so that `set -e` and friends never leak into a sourcing shell.
(
set -euo pipefail
cd "$_mn_root"

say() { echo "[setup] $*"; }
die() { echo "[setup] ERROR: $*" >&2; exit 1; }

PY="${PYTHON:-python3}"
VENV="$_mn_root/.venv"
STAMP="$VENV/.meganeura-setup-stamp"
LOG="$VENV/.meganeura-setup.log"

# ---- 1. system packages ---------------------------------------------------------------
have_vulkan_icd() {
    compgen -G "/usr/share/vulkan/icd.d/*.json" >/dev/null ||
        compgen -G "/etc/vulkan/icd.d/*.json" >/dev/null
}
have_vulkan_loader() {
    compgen -G "/usr/lib/*/libvulkan.so.1" >/dev/null ||
        compgen -G "/usr/lib64/libvulkan.so.1" >/dev/null ||
        compgen -G "/usr/lib/libvulkan.so.1" >/dev/null
}
have_python() {
    command -v "$PY" >/dev/null &&
        "$PY" -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null
}
have_venv_module() { [ -x "$VENV/bin/python" ] || "$PY" -c 'import ensurepip, venv' 2>/dev/null; }

need=()          # required: missing ones stop a non-root run
want=()          # optional: Xvfb, for the window tests and the windowed demo without a display
have_python || need+=(python3 python3-venv)
have_python && ! have_venv_module && need+=(python3-venv)
have_vulkan_icd || need+=(mesa-vulkan-drivers)
have_vulkan_loader || need+=(libvulkan1)
command -v Xvfb >/dev/null || want+=(xvfb)

pkgs="$(echo "${need[*]} ${want[*]}" | xargs)"
if [ -n "$pkgs" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "installing system packages with apt-get: $pkgs"
        export DEBIAN_FRONTEND=noninteractive
        LOG_APT="$(mktemp /tmp/meganeura-apt.XXXXXX.log)"
        if ! { apt-get update -q && apt-get install -y -q --no-install-recommends $pkgs; } \
                >"$LOG_APT" 2>&1; then
            tail -n 30 "$LOG_APT" >&2
            die "apt-get failed (full log: $LOG_APT)"
        fi
        rm -f "$LOG_APT"
    elif [ ${#need[@]} -gt 0 ]; then
        die "missing system packages: $pkgs
        install them as root, e.g.:  sudo apt-get install -y $pkgs
        then run this command again."
    else
        say "note: Xvfb is missing (sudo apt-get install -y xvfb); window tests need it without a display"
    fi
fi

# ---- 2. virtual environment -------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
    say "creating .venv ($("$PY" --version 2>&1))"
    "$PY" -m venv "$VENV" || die "'$PY -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"
fi

# ---- 3. Python packages -----------------------------------------------------------------
key="$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$key" ] &&
        "$VENV/bin/python" -c 'import meganeura' 2>/dev/null; then
    say "python packages up to date (.venv)"
else
    say "installing meganeura (editable) with extras test,demo,docs into .venv; first run takes minutes"
    # torch==2.13.0 comes from the test extra; a local folder of wheels, where the machine
    # has one, keeps pip from fetching a multi-GB CUDA build.
    # --no-compile: Python compiles what it imports when it first does, instead of pip
    # compiling every installed module up front (torch's thousands: ~50 s of a 2-core set-up)
    pip_args=(-q --disable-pip-version-check --no-compile)
    [ -d /opt/wheels ] && pip_args+=(--find-links /opt/wheels)
    if ! "$VENV/bin/python" -m pip install "${pip_args[@]}" -e ".[test,demo,docs]" >"$LOG" 2>&1; then
        tail -n 30 "$LOG" >&2
        die "pip install failed (full log: $LOG)"
    fi
    echo "$key" >"$STAMP"
fi

# ---- 4. a GPU adapter through wgpu ------------------------------------------------------
# Checked once per install (it costs a second); tests under MEGANEURA_REQUIRE_GPU=1 check again.
ADAPTER_STAMP="$VENV/.meganeura-adapter"
if [ ! -f "$ADAPTER_STAMP" ] || [ "$STAMP" -nt "$ADAPTER_STAMP" ]; then
    if adapter="$(timeout 120 "$VENV/bin/python" - 2>>"$LOG" <<'EOF'
import sys
import wgpu
a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
i = a.info
print(f"{i.get('device') or i.get('description')} ({i.get('backend_type')}, {i.get('adapter_type')})")
# With no Vulkan driver wgpu falls back to OpenGL (llvmpipe through EGL): not enough for us.
sys.exit(0 if i.get("backend_type") in ("Vulkan", "Metal", "D3D12") else 3)
EOF
)"; then
        say "GPU adapter: $adapter"
        echo "$adapter" >"$ADAPTER_STAMP"
    elif [ -n "$adapter" ]; then
        say "WARNING: wgpu found only $adapter, no Vulkan/Metal/D3D12 adapter; GPU tests will fail"
    else
        say "WARNING: wgpu found no GPU adapter (see $LOG); GPU tests will fail or skip"
    fi
fi
) || {
    _mn_rc=$?
    unset _mn_root
    if [[ "${BASH_SOURCE[0]}" != "${0}" ]]; then return "$_mn_rc"; else exit "$_mn_rc"; fi
}
unset _mn_root

"""Which wgpu device the runtime uses. Nothing here runs at import time.

With no device given, the runtime joins wgpu's default device, declaring its wishes
through wgpu.utils.preconfigure_default_device (the convention pygfx uses), so one
process shares one device between every wgpu library in it.
"""
from __future__ import annotations

import os
import re

PREFERRED_FEATURES = {"shader-f16", "subgroup", "subgroups", "timestamp-query", "timestamp-query-inside-passes"}


class NoAdapterError(RuntimeError):
    """No GPU adapter (not even a CPU one like lavapipe) is available."""


def default_device():
    """wgpu's shared default device, preferring the features our kernels can use."""
    import wgpu

    os.environ.setdefault("XDG_RUNTIME_DIR", _runtime_dir())
    utils = wgpu.utils
    if getattr(utils, "_meganeura_configured", False) is False and not _default_exists(utils):
        try:
            utils.preconfigure_default_device("meganeura", power_preference="high-performance",
                                              preferred_features=set(PREFERRED_FEATURES))
        except Exception:  # the default device already exists: use it as it is
            pass
        utils._meganeura_configured = True
    try:
        return utils.get_default_device()
    except RuntimeError as exc:
        raise NoAdapterError(
            "no GPU adapter found: install a Vulkan driver (on Debian/Ubuntu: "
            "apt-get install mesa-vulkan-drivers libvulkan1 for a CPU fallback)") from exc


def _default_exists(utils) -> bool:
    helper = getattr(utils.get_default_device, "__self__", None)
    return getattr(helper, "_the_device", None) is not None


def _runtime_dir() -> str:
    path = f"/tmp/meganeura-xdg-{os.getuid()}" if hasattr(os, "getuid") else "."
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def fresh_device():
    """A new device on the best adapter, with the features our kernels can use: what a
    session is rebuilt on after its device was lost (a lost device never returns)."""
    import wgpu

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        raise NoAdapterError("no GPU adapter found to rebuild the session on")
    return adapter.request_device_sync(required_features=[f for f in PREFERRED_FEATURES if f in adapter.features])


# the CPU rasterisers' kernel variants broadcast values within subgroups of this many lanes
CPU_LANES = 8
# lavapipe's subgroups are as wide as its SIMD vectors, whose bits its device name states
_LLVMPIPE = re.compile(r"llvmpipe\b.*?\b(\d+) bits")


def runs_cpu_variants(device) -> bool:
    """Whether `device` can run the CPU rasterisers' kernel variants: the subgroup feature,
    with subgroups of 8 lanes (lavapipe on 256-bit SIMD: "llvmpipe (LLVM 15.0.6, 256 bits)")."""
    m = _LLVMPIPE.search(str(device.adapter.info.get("device", "")))
    return "subgroup" in device.features and m is not None and int(m.group(1)) // 32 == CPU_LANES

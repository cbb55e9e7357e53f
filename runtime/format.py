"""The package format's constants, and helpers on a manifest as stored (msgpack maps: the compiler's
and the checks' view of it; the runtime reads it as typed records, runtime/records.py)."""
from __future__ import annotations

import math

import numpy as np

MAGIC = b"MNPK\r\n\x1a\n"
FORMAT_NAME = "meganeura-package"
FORMAT_VERSION = 5  # 5: dispatches may carry a "quick" variant; 4: kernels may read sizes from a uniform buffer ("lifted")
READABLE_VERSIONS = (3, 4, 5)  # 4: the same without quick variants, 3: nor lifted sizes
MAX_LIFTED = 64  # u32 sizes a kernel may read from it (compiler/codegen/lift_sizes.py)
MAX_MANIFEST = 256 << 20
ROLES = ("input", "param", "state", "constant", "output")
DTYPES = {"f32": np.float32, "i32": np.int32, "f16": np.float16}  # f16: parameters only (stored weights)
F16_MAX = 65504.0  # half precision's largest finite value
ACCESS = ("read", "read_write")
READ_STEP = 64 << 20  # bytes per read task when loading a file
OFFSET_ALIGN = 256  # byte offsets of tensors and bound ranges: WebGPU's largest minStorageBufferOffsetAlignment
DEVICE_CLASSES = ("cpu", "gpu")  # kernel variants: CPU rasterisers (lavapipe) rank kernels differently
QUICK = "quick"  # the quick tier's variant (Session(quick_start=True); compiler/lift_sizes.quick_tier)
VARIANTS = (*DEVICE_CLASSES, QUICK)


def as_variant(d: dict, variant: str) -> dict:
    """A dispatch as `variant` (a device class, or QUICK) runs it: its variant's kernel,
    workgroups and lifted sizes, where it has that variant; else the dispatch itself."""
    v = d.get("variants", {}).get(variant)
    return d if v is None else {**d, "kernel": v["kernel"], "workgroups": v["workgroups"], "lifted": v.get("lifted")}


def tensor_bytes(t: dict) -> int:
    """A manifest tensor's size in bytes (Python ints: no wrap-around, whatever its shape)."""
    return math.prod(t["shape"]) * np.dtype(DTYPES[t["dtype"]]).itemsize


def kernels_of(manifest: dict, variant: str, programs=None) -> set:
    """The kernels a device running `variant` makes pipelines of (for `programs`, names: default all)."""
    return {as_variant(d, variant)["kernel"] for name, p in manifest["programs"].items()
            if programs is None or name in programs for d in p["dispatches"]}

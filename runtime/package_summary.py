"""`meganeura info`'s description of a package (Package.summary)."""
from __future__ import annotations

import numpy as np

from .package import QUICK, kernels_of
from .training_state import deferred_buffers


def summary(m: dict, raw_size: int) -> str:
    """Its sizes, parameters, programs, kernels and training settings, one per line."""
    later = sum(m["buffers"][i] for i in deferred_buffers(m))
    lines = [f"meganeura package, format {m['format_version']}, compiler {m['compiler_version']}",
             f"  {raw_size} bytes; buffers {m['memory']['buffer_bytes']} bytes on the GPU"
             + (f" ({m['memory']['buffer_bytes'] - later} at load, the training state's {later} just after)"
                if later else "")]
    params = [t for t in m["tensors"] if t["role"] == "param"]
    count = sum(int(np.prod(t["shape"], dtype=np.int64)) for t in params)
    lines.append(f"  parameters: {len(params)} tensors, {count} values")
    halves = [t for t in params if t["dtype"] == "f16"]
    if halves:
        lines.append(f"  in half precision (f16): {len(halves)} of them, "
                     f"{sum(int(np.prod(t['shape'], dtype=np.int64)) for t in halves)} values")
    groups = {t["buffer"] for t in params if "offset" in t}
    if groups:
        lines.append(f"  parameter groups: {len(groups)} (a group's parameters share a buffer; the optimizer "
                     "updates a group in one kernel)")
    for t in params:
        lines.append(f"    {t['name']}: {t['dtype']}{t['shape']}")
    for name, p in m["programs"].items():
        ins = ", ".join(f"{k}: {m['tensors'][i]['dtype']}{m['tensors'][i]['shape']}"
                        for k, i in p["inputs"].items() if not k.startswith("__"))
        outs = ", ".join(f"{k}: {m['tensors'][i]['dtype']}{m['tensors'][i]['shape']}"
                         for k, i in p["outputs"].items())
        lines.append(f"  program {name}: {len(p['dispatches'])} dispatches; ({ins}) -> ({outs}); "
                     f"scratch peak {p['scratch_peak_bytes']} bytes")
    lines.append(f"  kernels: {len(m['kernels'])} distinct; a GPU makes {len(kernels_of(m, 'gpu'))} pipelines "
                 f"(with quick_start first {len(kernels_of(m, QUICK))}), a CPU rasteriser {len(kernels_of(m, 'cpu'))}")
    if m.get("training"):
        t = m["training"]
        lines.append(f"  training: loss {t['loss']}, optimizer {t['optimizer']}, lr {t['lr']}, "
                     f"frozen {len(t['frozen'])} tensors")
    if m.get("batch"):
        lines.append(f"  batch size: {m['batch']['size']}")
    return "\n".join(lines)

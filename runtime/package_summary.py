"""`meganeura info`'s description of a package (Package.summary)."""
from __future__ import annotations

from .format import QUICK
from .records import Manifest
from .training_state import deferred_buffers


def summary(m: Manifest, raw_size: int) -> str:
    """Its sizes, parameters, programs, kernels and training settings, one per line."""
    plan = m.plan
    later = sum(plan.buffers[i] for i in deferred_buffers(m))
    lines = [f"meganeura package, format {plan.format_version}, compiler {plan.compiler_version}",
             f"  {raw_size} bytes; buffers {plan.buffer_bytes} bytes on the GPU"
             + (f" ({plan.buffer_bytes - later} at load, the training state's {later} just after)" if later else "")]
    params = [t for t in plan.tensors if t.role == "param"]
    lines.append(f"  parameters: {len(params)} tensors, {sum(t.count for t in params)} values")
    halves = [t for t in params if t.dtype == "f16"]
    if halves:
        lines.append(f"  in half precision (f16): {len(halves)} of them, {sum(t.count for t in halves)} values")
    groups = {t.buffer for t in params if t.grouped}
    if groups:
        lines.append(f"  parameter groups: {len(groups)} (a group's parameters share a buffer; the optimizer "
                     "updates a group in one kernel)")
    for t in params:
        lines.append(f"    {t.name}: {_typed(t)}")
    for name, p in m.programs.items():
        ins = ", ".join(f"{k}: {_typed(t)}" for k, t in p.inputs.items() if not k.startswith("__"))
        outs = ", ".join(f"{k}: {_typed(t)}" for k, t in p.outputs.items())
        lines.append(f"  program {name}: {len(p.dispatches)} dispatches; ({ins}) -> ({outs}); "
                     f"scratch peak {p.scratch_peak_bytes} bytes")
    lines.append(f"  kernels: {len(m.kernels)} distinct; a GPU makes {len(m.kernels_of('gpu'))} pipelines "
                 f"(with quick_start first {len(m.kernels_of(QUICK))}), a CPU rasteriser {len(m.kernels_of('cpu'))}")
    if m.training:
        t = m.training
        lines.append(f"  training: loss {t.loss}, optimizer {t.optimizer}, lr {t.lr}, frozen {len(t.frozen)} tensors")
    if m.batch_size:
        lines.append(f"  batch size: {m.batch_size}")
    return "\n".join(lines)


def _typed(t) -> str:
    """A tensor's dtype and shape as the manifest writes them: f32[16, 12]."""
    return f"{t.dtype}{list(t.shape)}"

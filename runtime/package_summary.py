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
        if t.lora:
            lines.append(_lora(t.lora, params))
        if "train_step" in m.programs:
            lines.append(_step_memory(m, t.memory))
    if m.batch_size:
        lines.append(f"  batch size: {m.batch_size}")
    lines.extend(_initializers(m.initializers))
    return "\n".join(lines)


def step_bytes(m: Manifest, program: str = "train_step") -> int:
    """The bytes of the buffers a program needs: those it binds, and every parameter's and state's."""
    p = m.programs[program]
    used = {b.buffer for d in p.dispatches for b in d.bindings}
    used |= {t.buffer for t in (*p.inputs.values(), *p.outputs.values())}
    used |= {t.buffer for t in m.tensors if t.role in ("param", "state", "constant")}
    return sum(m.buffers[b] for b in used)


def _step_memory(m: Manifest, memory) -> str:
    """The training step's peak (its buffers), and what a memory budget recomputes for it."""
    line = f"  training step: peak {_mib(step_bytes(m))} (its buffers)"
    if memory is None:
        return line
    share = 100 * memory.extra_flops / max(memory.step_flops, 1)
    return (f"{line}; memory budget {_mib(memory.budget)}, {_mib(memory.unbudgeted_peak_bytes)} without it; "
            f"rematerialised {memory.rematerialised} values ({_mib(memory.rematerialised_bytes)}), "
            f"+{share:.1f}% FLOPs ({memory.extra_flops} of {memory.step_flops})")


def _mib(n: int) -> str:
    return f"{n} bytes ({n / (1 << 20):.1f} MiB)"


def _lora(lora, params) -> str:
    """The LoRA adapters: how many, their rank and alpha, the values they train of the model's."""
    sizes = {t.name: t.count for t in params}
    trained = sum(sizes.get(n, 0) for a in lora.adapters for n in (a.a, a.b))
    total = sum(sizes.values())
    return (f"  LoRA adapters: {len(lora.adapters)} (rank {lora.rank}, alpha {lora.alpha:g}, scale {lora.scale:g}) "
            f"on {', '.join(a.module for a in lora.adapters[:4])}{', ...' if len(lora.adapters) > 4 else ''}; "
            f"trainable {trained} of {total} values ({100 * trained / max(total, 1):.2f}%)")


def _initializers(notes) -> list:
    """The source file's weights that several nodes read: split into the parameters the source
    model kept apart, or kept tied as one."""
    lines = []
    for action, head in (("split", "weights split (the exporter merged equal tensors the model keeps apart)"),
                         ("tied", "weights kept tied (one parameter, as in the source model)")):
        these = [n for n in notes if n.action == action]
        if these:
            lines.append(f"  {head}: {len(these)}")
            lines += [f"    {n.initializer} -> {', '.join(n.params)}: {n.why}" for n in these]
    return lines


def _typed(t) -> str:
    """A tensor's dtype and shape as the manifest writes them: f32[16, 12]."""
    return f"{t.dtype}{list(t.shape)}"

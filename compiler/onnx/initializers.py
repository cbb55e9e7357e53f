"""Which parameter each read of a weight initializer is: exporters merge equal tensors.

Both torch exporters store one initializer for tensors of equal value, and the source
model may still keep them apart: fresh LayerNorms' all-ones scales, zero biases, running
statistics. Trained as one parameter they would take one update for several; a running
statistic sharing storage with a trainable bias would change as it trains. A parameter
the source model really uses twice (a tied embedding and LM head) stays one.

What each exporter leaves to tell them apart:
- TorchScript (`dynamo=False`): a merged tensor is read through an Identity whose output
  carries the dropped tensor's torch name (`norm2.weight = Identity(norm1.weight)`): that
  read becomes its own parameter under that name. Its constant folding stores W.T of a
  Linear weight as a new `onnx::MatMul_N`: one that equals the transpose of a weight
  the graph keeps (a tied LM head) is read as that weight, transposed.
- dynamo: each node records the torch call it came from (`pkg.torch.onnx.fx_node`), whose
  arguments name the parameters (`%p_norm2_weight`) and buffers (`%b_bn_running_mean`) it
  read. A node reading an initializer whose own placeholder is not among them reads a
  merged tensor: the read becomes the parameter its call names, under its torch name
  (module path from `pkg.torch.onnx.name_scopes`).
- Otherwise (other tools): an initializer holding one repeated value that nodes of
  different modules read (scopes from node names, `/encoder/layer.0/norm1/...`) is split
  into one parameter per module, `<module>.<weight|bias|...>`.
- BatchNormalization's running mean and variance never share a parameter with a read
  that trains.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import numpy as np

from ..ir.builder import InitializerNote
from .common import FOLDED_FROM_KEY, Known, parse_names

FX_KEY = "pkg.torch.onnx.fx_node"
SCOPES_KEY = "pkg.torch.onnx.name_scopes"
ORIGINAL_KEY = "pkg.torch.onnx.original_node_name"
RECURRENT = ("LSTM", "GRU", "RNN")
# the torch name of a weight input, by ONNX op and input position (naming a split read)
ROLES = {"LayerNormalization": ("", "weight", "bias"), "BatchNormalization": ("", "weight", "bias", "running_mean",
                                                                             "running_var"),
         "InstanceNormalization": ("", "weight", "bias"), "GroupNormalization": ("", "weight", "bias"),
         "RMSNormalization": ("", "weight"), "Gemm": ("", "weight", "bias"), "Conv": ("", "weight", "bias"),
         "ConvTranspose": ("", "weight", "bias"), "Gather": ("weight",), "MatMul": ("", "weight")}
_PLACEHOLDER = re.compile(r"%([pb]_[A-Za-z0-9_]+)")


@dataclass
class Sharing:
    """The importer's reads of weight initializers, as parameters.

    reads: (first output of a node, input position) -> the parameter name that read is;
    values: parameter name -> its Known (one per name, so that every read shares it);
    notes: what was split or tied, for the Model and `meganeura info`."""
    reads: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def inputs(self, node, env) -> list:
        """A node's input names, a planned read bound to its parameter's value in `env`."""
        names = list(node.input)
        key = _key(node)
        for i, name in enumerate(names):
            pname = self.reads.get((key, i))
            if pname is not None:
                env[f"{pname}#param"] = self.values[pname]
                names[i] = f"{pname}#param"
        return names


def recurrent_sources(g, meta: dict) -> dict:
    """Initializers that an LSTM / GRU / RNN reads as W, R or B and that the dynamo exporter
    folded from torch's parameters: initializer -> (op, [torch parameter names])."""
    out = {}
    for node in g.node:
        if node.op_type not in RECURRENT:
            continue
        named = set(_placeholders(node))
        for name in node.input[1:4]:
            src = parse_names(meta.get(name, {}).get(FOLDED_FROM_KEY, "[]"))
            torch_names = [s for s in src if f"p_{s.replace('.', '_')}" in named]
            if torch_names:
                out[name] = (node.op_type, torch_names)
    return out


def plan_sharing(g, env: dict, meta: dict, dynamo: bool) -> Sharing:
    """Which parameter each read of a float weight initializer is (module docstring)."""
    s = Sharing()
    reads = _weight_reads(g, env)
    if not dynamo:
        _tie_folded_transposes(env)
    own = {name: _own_placeholders(name, env[name], meta) for name in reads} if dynamo else {}
    present = {m.get(ORIGINAL_KEY) for m in meta.values()}  # placeholders of the graph's initializers
    outputs = {vi.name for vi in g.output}
    taken = set(env) | {v.name for v in env.values() if isinstance(v, Known)}
    for name, rs in reads.items():
        base = env[name]
        renamed = {}
        for node, i in rs:
            if dynamo:
                new = _named_by_call(node, i, base, own[name], present)
            else:  # TorchScript's merged tensor: Identity(kept) -> the dropped tensor's torch name
                new = node.output[0] if node.op_type == "Identity" and node.output[0] not in outputs else None
            if new is not None and new != base.name:
                renamed[(_key(node), i)] = new
        if not renamed and not (dynamo and any(own[name] & set(_placeholders(n)) for n, _ in rs)):
            renamed = _by_module(rs, base, taken)
        renamed.update(_running_stats(rs, base, renamed, taken))
        for key, new in renamed.items():
            s.reads[key] = new
            if new not in s.values:
                s.values[new] = Known(base.value, new, base.kind, base.transposed)
            taken.add(new)
        if renamed:
            names = sorted({base.name} | set(renamed.values()) if len(renamed) < len(rs) else set(renamed.values()))
            s.notes.append(InitializerNote("split", name, tuple(names), _why(rs, renamed)))
    s.notes.extend(_ties(reads, env, s))
    return s


# ------------------------------------------------------------------ reads
def _key(node) -> str:
    return next((o for o in node.output if o), node.name)


def _weight_reads(g, env) -> dict:
    """Float initializers imported as parameters or buffers -> [(node, input position)]."""
    out = {}
    for node in g.node:
        for i, name in enumerate(node.input):
            v = env.get(name)
            if isinstance(v, Known) and v.kind in ("param", "buffer") and v.value.dtype.kind == "f":
                out.setdefault(name, []).append((node, i))
    return out


def _placeholders(node) -> list:
    fx = next((p.value for p in node.metadata_props if p.key == FX_KEY), "")
    return _PLACEHOLDER.findall(fx)


def _module(node) -> str | None:
    """The torch module path a node was exported from, when its name or metadata says."""
    scopes = next((p.value for p in node.metadata_props if p.key == SCOPES_KEY), None)
    if scopes is not None:
        try:
            names = ast.literal_eval(scopes)
        except (ValueError, SyntaxError):
            return None
        return re.sub(r"@\d+$", "", str(names[-2])) if len(names) >= 2 else ""
    if node.name.startswith("/"):
        return ".".join(node.name.split("/")[1:-1])
    return None


def _role(node, i, base: Known) -> str:
    roles = ROLES.get(node.op_type, ())
    if i < len(roles) and roles[i]:
        return roles[i]
    tail = base.name.rsplit(".", 1)[-1]
    return tail if "." in base.name and "::" not in base.name else "weight"


# ------------------------------------------------------------------ the rules
def _own_placeholders(name, v: Known, meta) -> set:
    """The placeholders under which torch calls read initializer `name` (its own, and those
    of the parameters it was folded from)."""
    m = meta.get(name, {})
    own = {m[ORIGINAL_KEY]} if ORIGINAL_KEY in m else set()
    for src in parse_names(m.get(FOLDED_FROM_KEY, "[]")) + ([v.name] if v.transposed else []):
        under = src.replace(".", "_")
        own |= {f"p_{under}", f"b_{under}"}
    return own


def _named_by_call(node, i, base: Known, own: set, present: set) -> str | None:
    """dynamo: the parameter a node's torch call read where the exporter gave it a merged
    initializer, by its torch name; None where the call names the initializer's own."""
    named = _placeholders(node)
    if not named or own & set(named):
        return None
    missing = [p for p in named if p not in present]
    role = _role(node, i, base)
    fits = [p for p in missing if p.endswith(f"_{role}")] if len(missing) > 1 else missing
    if len(fits) != 1:
        return None
    module = _module(node) or ""
    for name in (f"{module}.{role}" if module else role, f"{module}.{base.name.rsplit('.', 1)[-1]}"):
        if f"{fits[0][:2]}{name.replace('.', '_')}" == fits[0]:
            return name
    return fits[0][2:]


def _by_module(rs, base: Known, taken) -> dict:
    """Other exporters: one repeated value read by different modules -> one parameter each."""
    modules = {}
    for node, i in rs:
        m = _module(node)
        if m is None:
            return {}
        modules.setdefault(_same_module(m, modules), []).append((node, i))
    value = base.value
    if len(modules) < 2 or not (value == value.reshape(-1)[0]).all():
        return {}
    keeper = next((m for m in modules if m and base.name.startswith(f"{m}.")), next(iter(modules)))
    out = {}
    for m, group in modules.items():
        if m == keeper:
            continue
        node, i = group[0]
        name = _free(f"{m}.{_role(node, i, base)}" if m else f"{base.name}.{_role(node, i, base)}", taken)
        out.update({(_key(n), j): name for n, j in group})
    return out


def _same_module(m, modules) -> str:
    """TorchScript names a module's second call `<module>_1`: the same module."""
    stripped = re.sub(r"_\d+$", "", m)
    return stripped if stripped != m and stripped in modules else m


def _running_stats(rs, base: Known, renamed: dict, taken) -> dict:
    """BatchNormalization's mean / variance reads that share their parameter with another
    read: a parameter of their own (frozen by the BatchNormalization builder)."""
    final = {(_key(n), i): renamed.get((_key(n), i), base.name) for n, i in rs}
    out = {}
    for node, i in rs:
        key = (_key(node), i)
        if node.op_type != "BatchNormalization" or i not in (3, 4):
            continue
        others = [k for k, name in final.items() if name == final[key] and k != key
                  and not (k[1] in (3, 4) and k[0] == key[0])]
        if others:
            module = _module(node)
            out[key] = _free(f"{module}.{ROLES['BatchNormalization'][i]}" if module
                             else f"{final[key]}.{ROLES['BatchNormalization'][i]}", taken)
            taken.add(out[key])
    return out


def _free(name, taken) -> str:
    k, out = 1, name
    while out in taken:
        out, k = f"{name}#{k}", k + 1
    return out


def _why(rs, renamed) -> str:
    ops = {n.op_type for n, _ in rs}
    if "Identity" in ops:
        return "the exporter merged equal tensors of different modules"
    if any(n.op_type == "BatchNormalization" and i in (3, 4) for n, i in rs):
        return "a running statistic shared storage with a trainable parameter"
    return "read by different modules as a merged tensor"


# ------------------------------------------------------------------ ties
def _tie_folded_transposes(env):
    """TorchScript folds W.T of a Linear into `onnx::MatMul_N`; one equal to the transpose of
    a weight the graph keeps is that weight (a tied embedding and LM head)."""
    def matrices(folded):
        return [(name, v.value) for name, v in list(env.items()) if isinstance(v, Known) and v.kind == "param"
                and v.value.ndim == 2 and ("::" in name) == folded]

    named = {}
    for name, w in matrices(False):
        named.setdefault((w.shape, w.dtype), []).append(name)
    for name, value in matrices(True):
        for other in named.get((value.shape[::-1], value.dtype), ()):
            w = env[other].value  # (a constant fill is as likely a merged fresh weight: not tied)
            if w[0, 0] == value[0, 0] and np.array_equal(w, value.T) and not (w == w[0, 0]).all():
                env[name] = Known(w, other, "param", transposed=True)
                break


def _ties(reads, env, s) -> list:
    """Parameters that nodes of different (unrelated) modules read: tied in the source."""
    by_param = {}
    for name, rs in reads.items():
        for node, i in rs:
            pname = s.reads.get((_key(node), i), env[name].name)
            m = _module(node)
            if m is not None:
                by_param.setdefault(pname, {}).setdefault(m, name)
    notes = []
    for pname, modules in by_param.items():
        ms = sorted(modules)
        if len(ms) > 1 and not any(a != b and (b.startswith(f"{a}.") or not a) for a in ms for b in ms):
            notes.append(InitializerNote("tied", pname, (pname,), f"one parameter read by {', '.join(ms)}"))
    return notes

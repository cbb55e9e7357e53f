"""Low-rank adapters (LoRA), as PEFT makes them: y = x W^T + (alpha / r) x A^T B^T.

Each targeted weight W keeps its place and its value, frozen; A [r, in] starts Kaiming-uniform
(a = sqrt(5), as PEFT's), B [out, r] at zeros, so the adapted model starts as the base one. They
are parameters named `<module>.lora_A.weight` / `.lora_B.weight`, <module> being the weight's
name without its `.weight` (PEFT's names, less its `base_model.model.` prefix). A weight is one a
matmul reads as its right-hand side, in PyTorch's [out, in] layout (trans_b) or as an ONNX
MatMul holds it, [in, out]; the adapter's path is the same either way, only a merge
(runtime/adapters.py) transposes B @ A for the latter.
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from .emit import Emitter
from .graph import Graph, Node


@dataclass(frozen=True)
class Adapter:
    module: str  # the adapted module's name, as PEFT writes it
    weight: str  # the base weight's parameter name
    a: str  # the parameter names of A [rank, in] and B [out, rank]
    b: str
    transposed: bool  # W is stored [in, out] (a MatMul's right-hand side), not PyTorch's [out, in]


@dataclass(frozen=True)
class Adapters:
    """A forward graph with adapters, and what the package records of them."""
    graph: Graph
    rank: int
    alpha: float
    adapters: tuple

    def manifest(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha, "adapters": [asdict(a) for a in self.adapters]}


def matmul_weights(g: Graph) -> dict:
    """Parameter name -> [(matmul node id, transposed)] for each 2-D parameter a matmul reads as
    its right-hand side, directly or through a transpose; `transposed`: stored [in, out]."""
    names = {i: name for name, i in g.params.items() if len(g.nodes[i].shape) == 2}
    out = {}
    for i, n in enumerate(g.nodes):
        if n.op != "matmul":
            continue
        w, in_out = n.inputs[1], not n.attr("trans_b")
        if g.nodes[w].op == "transpose" and tuple(g.nodes[w].attr("perm")) == (1, 0):
            w, in_out = g.nodes[w].inputs[0], not in_out
        if w in names:
            out.setdefault(names[w], []).append((i, in_out))
    return out


def targets(g: Graph, patterns, users: dict | None = None) -> list:
    """The matmul weights a glob of `patterns` matches, by parameter name or by the name of a source
    node reading it (`users`: parameter name -> ONNX node names); ValueError naming a pattern that
    matches none, and the weights there are."""
    users = users or {}
    weights = matmul_weights(g)
    hits = set()
    for p in patterns:
        found = {w for w in weights if fnmatch.fnmatchcase(w, p)
                 or any(fnmatch.fnmatchcase(u, p) for u in users.get(w, ()))}
        if not found:
            others = _some(sorted(set(g.params) - set(weights)))
            raise ValueError(f"LoRA target {p!r} matches no matmul weight (by name or by a node reading it); "
                             f"the model's matmul weights are: {_some(sorted(weights))}"
                             + (f"; its other parameters: {others}" if others != "none" else ""))
        hits |= found
    return sorted(hits)


def _some(names: list) -> str:
    return ", ".join(names[:10]) + (f", ... ({len(names)} in all)" if len(names) > 10 else "") or "none"


def module_name(weight: str, users: dict | None = None) -> str:
    """PEFT's module name of a weight: its name less `.weight`; for a weight an exporter renamed
    (`onnx::MatMul_386`), the module path of the node reading it (`/enc/query/MatMul` -> enc.query)."""
    if weight.endswith(".weight"):
        return weight[: -len(".weight")]
    paths = {".".join(u.split("/")[1:-1]) for u in (users or {}).get(weight, ()) if u.startswith("/")}
    return paths.pop() if len(paths) == 1 and "" not in paths else weight


def kaiming_uniform(rng, rows: int, cols: int) -> np.ndarray:
    """torch.nn.init.kaiming_uniform_(a=sqrt(5)) of a [rows, cols] weight: U(-1/sqrt(cols), 1/sqrt(cols))."""
    bound = 1.0 / math.sqrt(cols)
    return rng.uniform(-bound, bound, (rows, cols)).astype(np.float32)


def add_adapters(g: Graph, rank: int, alpha: float, patterns, users: dict | None = None, seed: int = 0) -> Adapters:
    """A copy of forward graph `g` with an adapter beside each matmul weight `patterns` match, every
    other parameter frozen."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"lora_rank must be an integer >= 1, not {rank!r}")
    if not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"lora_alpha must be a positive number, not {alpha!r}")
    if not patterns:
        raise ValueError("LoRA needs lora_targets: globs of the weights to adapt")
    chosen = targets(g, patterns, users)
    modules = {w: module_name(w, users) for w in chosen}
    names = [f"{m}.lora_{x}.weight" for m in modules.values() for x in "AB"]
    taken = sorted(set(names) & set(g.params)) or sorted({n for n in names if names.count(n) > 1})
    if taken:
        raise ValueError(f"LoRA cannot name its adapter {taken[0]!r}: the model has a parameter of that name, "
                         "or two of its target weights belong to one module")
    sites = {i: (w, in_out) for w, uses in matmul_weights(g).items() if w in chosen for i, in_out in uses}
    out = Graph(values=dict(g.values), frozen=set(g.frozen) | set(g.params))
    e, rng, remap, made = Emitter(out), np.random.default_rng(seed), {}, {}
    for i, n in enumerate(g.nodes):
        remap[i] = out.add(replace(n, inputs=tuple(remap[j] for j in n.inputs)))
        if i in sites:
            remap[i] = _adapted(e, n, remap, remap[i], sites[i], made, rank, alpha / rank, rng, modules)
    out.outputs = {k: remap[i] for k, i in g.outputs.items()}
    out.assigns = {k: remap[i] for k, i in g.assigns.items()}
    return Adapters(out, rank, float(alpha), tuple(adapter for adapter, _, _ in made.values()))


def _adapted(e: Emitter, n: Node, remap: dict, y: int, site, made: dict, rank: int, scale: float, rng,
             modules: dict) -> int:
    """y + scale * (x A^T) B^T for matmul `n` (its output `y`), A and B made at their weight's first site."""
    weight, in_out = site
    x, ta = remap[n.inputs[0]], bool(n.attr("trans_a"))
    fan_in = e.shape(x)[-2] if ta else e.shape(x)[-1]
    fan_out = n.shape[-1]
    if weight not in made:
        module = modules[weight]
        a, b = f"{module}.lora_A.weight", f"{module}.lora_B.weight"
        made[weight] = (Adapter(module, weight, a, b, in_out),
                        e.leaf("param", a, (rank, fan_in), value=kaiming_uniform(rng, rank, fan_in)),
                        e.leaf("param", b, (fan_out, rank), value=np.zeros((fan_out, rank), np.float32)))
    adapter, a, b = made[weight]
    if adapter.transposed != in_out or e.shape(a)[1] != fan_in:
        raise ValueError(f"weight {weight!r} is read by matmuls in two layouts: LoRA cannot adapt it")
    low = e.scale(e.op("matmul", x, a, trans_a=ta, trans_b=True), scale)
    return e.op("add", y, e.op("matmul", low, b, trans_b=True))

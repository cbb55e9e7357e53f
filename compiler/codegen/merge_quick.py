"""The quick tier's kernels merged into fewer pipelines.

One text holds several kernels that bind the same buffers the same way, and a lifted value (the
selector) picks which one a dispatch runs. NVIDIA's driver spends 5 ms or more on any pipeline,
however small, before the kernel's own code; a merged kernel pays that once for several.

Each member's entry function is written inline in one `case` of a switch on the selector (a
uniform: the dispatch takes one branch, and a member's barriers stay in uniform control flow); its
other module-scope names get a prefix of their own (mnq<member>_), its storage bindings the merged
kernel's names (mn_b<binding>), and workgroup variables declared alike are shared (mnw<n>_: one
member runs per dispatch). Members are binned, largest first, up to MERGE_CHARS of text per merged
kernel: the driver compiles one pipeline on one thread, and a first launch compiles several at
once, one per thread.
"""
from __future__ import annotations

import hashlib
import re

from ...runtime.package import MAX_LIFTED, QUICK
from ...runtime.training_state import TRAINING
from ...runtime.workgroup_memory import workgroup_bytes
from ..options import DEFAULT, CompileOptions
from . import wgsl
from .lift_sizes import COMMENT, NAME, bracket_end, each_entry

MERGE_CHARS = 12000  # most WGSL characters of members in one merged kernel
WORKGROUP_BYTES = 16384  # WebGPU's guaranteed workgroup memory: a merged kernel needs no more than that

_ATTRS = re.compile(r"(?:@\w+(?:\s*\([^)]*\))?\s*)*")
_BINDING = re.compile(r"@group\(0\)\s*@binding\((\d+)\)\s*var<(storage|uniform)([^>]*)>\s*(\w+)\s*:\s*([^;]+);")
_WORKGROUP = re.compile(r"var<workgroup>\s*(\w+)\s*:\s*([^;]+);")
_NAMED = re.compile(r"(?:fn|const)\s+(\w+)")
_BRACE = re.compile(r"[{}]")
# a type whose sizes are literals (a type naming a constant would name it before it is renamed)
_LITERAL_TYPE = re.compile(r"(?:array|vec[234]|mat[234]x[234]|atomic|f32|f16|u32|i32|bool|\d+u?|[<>,\s])+")
_BUILTIN = re.compile(r"@builtin\((\w+)\)\s*(\w+)\s*:\s*([\w<>]+)")


def _block_end(code: str, i: int) -> int:
    """The index just past the brace closing the one before `i` (WGSL has no strings)."""
    depth = 1
    for m in _BRACE.finditer(code, i):
        depth += 1 if m.group() == "{" else -1
        if not depth:
            return m.end()
    raise ValueError("unclosed block")


def _items(code: str) -> list:
    """The module-scope declarations of `code` (comments stripped), each with its attributes."""
    items, i = [], 0
    while True:
        while i < len(code) and code[i].isspace():
            i += 1
        if i >= len(code):
            return items
        start = i
        i = _ATTRS.match(code, i).end()
        if code.startswith("fn", i):
            i = _block_end(code, code.index("{", code.index(")", i)) + 1)
        else:
            i = code.index(";", i) + 1
        items.append(code[start:i])


def _parse(k: dict):
    """(storage bindings {index: (access, type)}, {name: type} of workgroup variables, other
    declarations, [(builtin, name, type)] of the entry, the entry's body, names to rename), or
    None for a kernel this cannot merge."""
    try:
        items = _items(COMMENT.sub("", k["wgsl"]))
    except ValueError:
        return None
    bindings, workgroup, others, entry, names = {}, {}, [], None, {}
    for item in items:
        b = _BINDING.fullmatch(item.strip())
        w = _WORKGROUP.fullmatch(item.strip())
        bare = item[_ATTRS.match(item).end():]
        if b and b.group(2) == "storage":
            if not _LITERAL_TYPE.fullmatch(b.group(5).strip()):
                return None
            bindings[int(b.group(1))] = (b.group(3).strip(", "), b.group(5).strip())
            names[b.group(4)] = f"mn_b{b.group(1)}"
        elif b and b.group(4) == NAME:
            continue  # declared again, as long as the longest member's and the selector need
        elif w:
            if not _LITERAL_TYPE.fullmatch(w.group(2).strip()):
                return None
            workgroup[w.group(1)] = w.group(2).strip()
        elif bare.startswith("fn") and "@compute" in item:
            head = re.match(rf"fn\s+{re.escape(k['entry'])}\s*\(", bare)
            if head is None or entry is not None:
                return None
            close = bracket_end(bare, head.end(), "(", ")")
            params = _BUILTIN.findall(bare[head.end():close])
            if bare[head.end():close].count(":") != len(params):
                return None  # a parameter that is not a builtin
            body = bare[bare.index("{", close) + 1:bare.rindex("}")]
            entry = (params, body)
        elif _NAMED.match(bare):
            names[_NAMED.match(bare).group(1)] = None
            others.append(item)
        else:
            return None  # enable, struct, override...: left alone
    if entry is None or sorted(bindings) != list(range(len(k["access"]))):
        return None
    return bindings, workgroup, others, entry, names


def _renamer(names: dict):
    """text -> text with each whole identifier in `names` (not a field after a dot) renamed."""
    if not names:
        return lambda text: text
    found = re.compile(r"(?<![\w.@])(" + "|".join(map(re.escape, names)) + r")\b")
    return lambda text: found.sub(lambda m: names[m.group(1)], text)


def merged_kernel(members: list, parsed: list) -> tuple:
    """(one kernel for `members` (kernels binding alike), the selector's index among its lifted
    values): member j runs where the selector is j."""
    lifted = max(k.get("lifted", 0) for k in members)
    labels = [k.get("label", "").removesuffix(f" ({QUICK})") for k in members]
    shared = {}  # (name, type) of a workgroup variable -> its name in the merged kernel
    decls, cases, builtins = [], [], {}
    for j, (k, (bindings, workgroup, others, (params, body), names)) in enumerate(zip(members, parsed)):
        names = {name: new or f"mnq{j}_{name}" for name, new in names.items()}
        for name, ty in workgroup.items():
            if (name, ty) not in shared:
                shared[name, ty] = f"mnw{len(shared)}_{name}"
                decls.append(f"var<workgroup> {shared[name, ty]}: {ty};")
            names[name] = shared[name, ty]
        renamed = _renamer(names)
        decls.extend(renamed(item) for item in others)
        lets = "".join(f"        let {renamed(p)}: {ty} = mn_{b};\n" for b, p, ty in params)
        builtins.update({b: ty for b, _, ty in params})
        cases.append(f"    case {j}u: {{\n{lets}        {{{renamed(body)}}}\n    }}")
    bindings = parsed[0][0]
    storage = "\n".join(f"@group(0) @binding({i}) var<storage{', ' + a if a else ''}> mn_b{i}: {ty};"
                        for i, (a, ty) in sorted(bindings.items()))
    ws = members[0]["workgroup_size"]
    text = wgsl.render(
        "merged", MEMBERS=str(len(members)), LABELS=" ".join(", ".join(labels).split()),
        SIZES=f"@group(0) @binding({len(bindings)}) var<uniform> {NAME}: array<vec4<u32>, {lifted // 4 + 1}>;",
        STORAGE=storage, DECLS="\n".join(decls), WORKGROUP_SIZE=", ".join(map(str, ws)),
        PARAMS=", ".join(f"@builtin({b}) mn_{b}: {ty}" for b, ty in sorted(builtins.items())),
        SELECTOR=f"{NAME}[{lifted // 4}u][{lifted % 4}u]", CASES="\n".join(cases))
    label = "merged: " + " ".join(" + ".join(dict.fromkeys(labels))[:200].split()) + f" ({QUICK})"
    kernel = {**members[0], "label": label, "wgsl": text, "entry": "main", "lifted": lifted + 1,
              "sha256": hashlib.sha256(text.encode()).hexdigest()}
    return kernel, lifted


def _bins(group: list, kernels: list) -> list:
    """`group` (kernel indices) in bins of at most MERGE_CHARS characters, largest first; a
    kernel over it stays alone."""
    bins = []
    for i in sorted(group, key=lambda i: -len(kernels[i]["wgsl"])):
        size = len(kernels[i]["wgsl"])
        fit = next((b for b in bins if b[0] + size <= MERGE_CHARS), None)
        if fit is None:
            bins.append([size, [i]])
        else:
            fit[0] += size
            fit[1].append(i)
    return [b[1] for b in bins]


def merge(kernels: list, programs: dict, options: CompileOptions = DEFAULT) -> tuple:
    """(kernels, programs) with the kernels only quick variants run merged by how they bind
    (storage bindings, workgroup size, lifted sizes under MAX_LIFTED); each quick variant of a
    member names the merged kernel, its lifted values padded and the selector after them."""
    if not options.merge_quick:
        return kernels, programs
    elsewhere = {e["kernel"] for p in programs.values() for d in p["dispatches"]
                 for c, e in ((None, d), *d.get("variants", {}).items()) if c != QUICK}
    quick = sorted({d["variants"][QUICK]["kernel"] for p in programs.values() for d in p["dispatches"]
                    if QUICK in d.get("variants", {})} - elsewhere)
    # a Session compiles the training step's own kernels behind its load (runtime/training_state.py):
    # they merge among themselves, the load's among its own
    first = {d["variants"][QUICK]["kernel"] for name, p in programs.items() if name != TRAINING
             for d in p["dispatches"] if QUICK in d.get("variants", {})}
    groups, parsed = {}, {}
    for i in quick:
        k = kernels[i]
        p = _parse(k) if k.get("lifted", 0) < MAX_LIFTED else None
        if p is not None:
            parsed[i] = p
            groups.setdefault((tuple(sorted(p[0].items())), tuple(k["workgroup_size"]), i in first), []).append(i)
    new_kernels, remap = list(kernels), {}
    for group in groups.values():
        for members in _bins(group, kernels):
            if len(members) < 2:
                continue
            kernel, slot = merged_kernel([kernels[i] for i in members], [parsed[i] for i in members])
            need = workgroup_bytes(kernel["wgsl"])  # (a bin over it stays apart: members that each use much of it)
            most = max(WORKGROUP_BYTES, *(workgroup_bytes(kernels[i]["wgsl"]) or 0 for i in members))
            if need is None or need > most:
                continue
            new_kernels.append(kernel)
            remap.update((i, (len(new_kernels) - 1, slot, j)) for j, i in enumerate(members))
    if not remap:
        return kernels, programs

    def with_merged(d):
        v = d.get("variants", {}).get(QUICK)
        if v is None or v["kernel"] not in remap:
            return d
        k, slot, j = remap[v["kernel"]]
        values = list(v.get("lifted") or [])
        return {**d, "variants": {**d["variants"], QUICK: {**v, "kernel": k,
                                                            "lifted": values + [0] * (slot - len(values)) + [j]}}}
    programs = {name: {**p, "dispatches": [with_merged(d) for d in p["dispatches"]]} for name, p in programs.items()}
    named = sorted({e["kernel"] for p in programs.values() for d in p["dispatches"]
                    for e in (d, *d.get("variants", {}).values())})
    index = {old: new for new, old in enumerate(named)}
    return [new_kernels[i] for i in named], each_entry(programs, lambda e: {**e, "kernel": index[e["kernel"]]})

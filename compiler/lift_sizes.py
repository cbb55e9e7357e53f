"""One kernel for a family of kernels that differ only in the sizes written into them.

A package's kernels often differ only in their u32 literals (ResNet-50's training step: 34 AdamW
update kernels, one per parameter-group size; reductions, split-K sums, elementwise chains), and
the driver compiles each text apart (NVIDIA: ~10 ms each, 3 ms even from its cache) on a game's
first launch.
`lift` groups the kernels whose texts match once their liftable literals are blanked, writes one
kernel per family in which the literals that differ between its members are read from a uniform
buffer (`mn_sizes`, bound after the storage buffers), and gives each dispatch its values
("lifted" in the manifest; the runtime packs them into one uniform buffer).

A literal stays written in where WGSL needs a constant (`const`, `const_assert` and `override`
statements, attributes, `array<...>` sizes, `case` labels) and in a divisor (see _fixed); a
family whose members differ there is not one family. Kernels with private or function-scope arrays are left alone (a runtime index into one is
a 60x trap on NVIDIA), and so are the templates marked FIXED: the tiled GEMMs and attention,
whose inner loops divide by their sizes (by a constant, a multiply and a shift; by a uniform, a
long division). Literals with other suffixes or none stay.
"""
from __future__ import annotations

import hashlib
import re

from ..runtime.package import MAX_LIFTED

ENABLED = True  # bench/run.py --no-lift-sizes
FIXED = "// Sizes stay written in (compiler/lift_sizes.py)"  # a template's mark (igemm_common, attention*)
NAME = "mn_sizes"

_LITERAL = re.compile(r"(?<![\w.])(\d+)u\b")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_CONST_STMT = re.compile(r"\b(?:const|const_assert|override)\b[^;]*;")
_ATTRIBUTE = re.compile(r"@\w+\s*\([^)]*\)")
_DIVIDES = re.compile(r"[/%]=?\s*")  # an operator whose right operand must stay a constant
_CASE = re.compile(r"\bcase\b[^:{]*[:{]")
# arrays held in registers or in structs: a runtime index into one is a 60x trap on NVIDIA
_PRIVATE_ARRAY = re.compile(r"\b(?:var|let)\b(?:<(?:private|function)>)?\s+\w+\s*(?::[^=;]*\barray\b|=\s*array\b)"
                            r"|\bstruct\s+\w+\s*\{[^}]*\barray\b")


def _closing(code: str, i: int, opening: str, closing: str) -> int:
    """The index just past the bracket closing the one before `i` (parentheses inside skipped)."""
    depth, parens = 1, 0
    while i < len(code) and depth:
        c = code[i]
        if c == "(" and opening != "(":
            parens += 1
        elif c == ")" and opening != "(" and parens:
            parens -= 1
        elif not parens:
            depth += (c == opening) - (c == closing)
        i += 1
    return i


def _fixed(code: str) -> list:
    """Spans of `code` (comments stripped) where a literal must stay a constant: const
    statements, attributes, case labels, array<...> templates (a shift's '>>' inside parentheses
    skipped), and the right operand of every division or remainder (by a constant, a multiply and
    a shift; by a uniform, a long sequence)."""
    spans = [m.span() for rx in (_CONST_STMT, _ATTRIBUTE, _CASE) for m in rx.finditer(code)]
    for m in re.finditer(r"\barray\s*<", code):
        spans.append((m.start(), _closing(code, m.end(), "<", ">")))
    for m in _DIVIDES.finditer(code):
        i = m.end()
        if code.startswith("(", i):
            spans.append((i, _closing(code, i + 1, "(", ")")))
        else:  # a name or literal, maybe indexed or called: up to the next operator or delimiter
            word = re.match(r"[\w.]+(?:\s*[\[(])?", code[i:])
            end = i + (word.end() if word else 0)
            if word and code[end - 1] in "[(":
                end = _closing(code, end, code[end - 1], "]" if code[end - 1] == "[" else ")")
            spans.append((i, end))
    return spans


def skeleton(code: str):
    """(text without comments, [(start, end, value)] of its liftable literals, the text with
    them blanked), or None where nothing may be lifted."""
    if FIXED in code:
        return None
    text = _COMMENT.sub("", code)
    if _PRIVATE_ARRAY.search(text):
        return None
    fixed = _fixed(text)
    blocked = bytearray(len(text))
    for lo, hi in fixed:
        blocked[lo:hi] = b"\x01" * (hi - lo)
    found = [(m.start(), m.end(), int(m.group(1))) for m in _LITERAL.finditer(text) if not blocked[m.start()]]
    if not found:
        return None
    parts, at = [], 0
    for lo, hi, _ in found:
        parts.append(text[at:lo])
        parts.append("#")
        at = hi
    parts.append(text[at:])
    return text, found, "".join(parts)


def lifted_kernel(text: str, found: list, columns: list, members: int, bindings: int) -> str:
    """`text` with the literals at `columns` (indices into `found`) read from mn_sizes."""
    out, at = [], 0
    for j, col in enumerate(columns):
        lo, hi, _ = found[col]
        out.append(text[at:lo])
        out.append(f"{NAME}[{j // 4}u][{j % 4}u]")
        at = hi
    out.append(text[at:])
    head = (f"// One kernel for {members} that differ only in sizes: those read from {NAME} "
            f"(compiler/lift_sizes.py).\n"
            f"@group(0) @binding({bindings}) var<uniform> {NAME}: array<vec4<u32>, {-(-len(columns) // 4)}>;\n")
    return head + "".join(out)


def lift(kernels: list, programs: dict) -> tuple:
    """(kernels, programs) with each family of size variants as one kernel; dispatches (and
    their device-class variants) of a family's members name its kernel and carry "lifted",
    their values. Kernels no dispatch uses any more are dropped."""
    if not ENABLED:
        return kernels, programs
    families = {}
    shapes = {}
    for i, k in enumerate(kernels):
        sk = skeleton(k["wgsl"])
        if sk is None:
            continue
        shapes[i] = sk
        # (the label too: profiles group time by it, and "x3" says how many tensors a kernel covers)
        key = (sk[2], k.get("label", ""), k["entry"], tuple(k["workgroup_size"]), tuple(k["access"]), len(sk[1]))
        families.setdefault(key, []).append(i)
    new_kernels = list(kernels)
    remap = {}  # old kernel -> (family kernel, its lifted values)
    for key, members in families.items():
        if len(members) < 2:
            continue
        found = [shapes[i][1] for i in members]
        columns = [c for c in range(len(found[0])) if len({f[c][2] for f in found}) > 1]
        if not columns or len(columns) > MAX_LIFTED:
            continue
        first = kernels[members[0]]
        text = lifted_kernel(shapes[members[0]][0], found[0], columns, len(members), len(first["access"]))
        new_kernels.append({**first, "wgsl": text, "lifted": len(columns),
                            "sha256": hashlib.sha256(text.encode()).hexdigest()})
        for i, f in zip(members, found):
            remap[i] = (len(new_kernels) - 1, [f[c][2] for c in columns])
    if not remap:
        return kernels, programs
    # the members go (every kernel is some dispatch's: the writer adds them so), the families stay
    kept = [i for i in range(len(new_kernels)) if i not in remap]
    index = {old: new for new, old in enumerate(kept)}

    def moved(entry):
        k, values = remap.get(entry["kernel"], (entry["kernel"], None))
        return {**entry, "kernel": index[k], **({"lifted": values} if values is not None else {})}
    programs = {name: {**p, "dispatches": [
        {**moved(d), **({"variants": {c: moved(v) for c, v in d["variants"].items()}} if "variants" in d else {})}
        for d in p["dispatches"]]} for name, p in programs.items()}
    return [new_kernels[i] for i in kept], programs

"""One kernel for a family of kernels that differ only in the sizes written into them.

A package's kernels often differ only in their u32 literals (ResNet-50's training step: 34 AdamW
update kernels, one per parameter-group size; reductions, split-K sums, elementwise chains), and
the driver compiles each text apart (NVIDIA's: ~10 ms each, ~3 ms even from its cache) on a game's
first launch.
`lift` groups the kernels whose texts match once their liftable literals are blanked, writes one
kernel per family in which the literals that differ between its members are read from a uniform
buffer (`mn_sizes`, bound after the storage buffers), and gives each dispatch its values
("lifted" in the manifest; the runtime packs them into one uniform buffer).

A literal stays written in where WGSL needs a constant (`const`, `const_assert` and `override`
statements, attributes, `array<...>` sizes, `case` labels) and in a divisor (see _fixed); a
family whose members differ there is not one family. Kernels with private or function-scope
arrays are left alone (a runtime index into one is a 60x trap on NVIDIA; the quick tier lifts
those marked LOOPED, indexed at run time anyway), and so are the templates marked FIXED: the
tiled GEMMs and attention, whose inner loops divide by their sizes (by a constant, a multiply and
a shift; by a uniform, a long division). Literals with other suffixes or none stay; the quick
tier (quick_tier) also lifts f32(...) literals and typed i32 ones (`3i`, wgsl.i32_literal).
"""
from __future__ import annotations

import hashlib
import re
import struct

from ...runtime.package import MAX_LIFTED, QUICK, as_variant
from ..options import DEFAULT, CompileOptions

FIXED = "// Sizes stay written in (compiler/lift_sizes.py)"  # a template's mark (igemm_common, attention*)
# a quick-tier kernel's mark: its private arrays are indexed at run time anyway (slower to run,
# faster to compile: codegen/attention.py's looped heads), so the quick tier lifts it all the same
LOOPED = "// Private arrays indexed in loops on purpose (compiler/lift_sizes.py)"
NAME = "mn_sizes"

# A pattern that starts with a letter or a digit is scanned for it quickly; one that starts with
# \b or a look-behind is tried at every position. So a word's start is checked after its first
# letter (`c(?<!\wc)onst` is `\bconst`), or after the match (_starts_word).
_LITERAL = re.compile(r"u\b")  # a u32 literal's suffix: its digits before it (_literals)
# an f32 constant as wgsl.f32_literal writes it: the quick tier reads it as bits (bitcast<f32>)
_F32_LITERAL = re.compile(r"f32\((-?(?:\d+\.\d*|\d+)(?:e[-+]?\d+)?)\)")  # (at a word's start)
_I32_LITERAL = re.compile(r"i\b")  # a typed i32 literal's suffix (wgsl.i32_literal): i32(...) of one
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# (a module-scope var<private>'s initializer must be a constant expression too)
_CONST_STMT = re.compile(r"(?:c(?<!\wc)onst|c(?<!\wc)onst_assert|o(?<!\wo)verride|v(?<!\wv)ar\s*<\s*private\s*>)[^;]*;")
_ATTRIBUTE = re.compile(r"@\w+\s*\([^)]*\)")
_DIVIDES = re.compile(r"[/%]=?\s*")  # an operator whose right operand must stay a constant
_DIVISOR = re.compile(r"(?:-\s*)?[\w.]+(?:\s*[\[(])?")  # a name or literal, maybe indexed or called (or negative)
_ARRAY = re.compile(r"array\s*<")  # (at a word's start)
_U32_CONST = re.compile(r"c(?<!\wc)onst\s+(\w+)\s*:\s*u32\s*=\s*(\d+)u\s*;")
# where a name is declared otherwise than as a constant: a let, var, function, struct, alias,
# override, or a parameter or field (`(name:`, `, name:`, `{ name:`)
_DECLARED = re.compile(r"(?:l(?<!\wl)et|v(?<!\wv)ar|f(?<!\wf)n|s(?<!\ws)truct|a(?<!\wa)lias|o(?<!\wo)verride)\s+(?=(\w+)\b)"
                       r"|[(,{]\s*(?=(\w+)\s*:)")
_CASE = re.compile(r"\bcase\b[^:{]*[:{]")
# arrays held in registers or in structs: a runtime index into one is a 60x trap on NVIDIA
_PRIVATE_ARRAY = re.compile(r"(?:v(?<!\wv)ar|l(?<!\wl)et)\b(?:<(?:private|function)>)?\s+\w+\s*(?::[^=;]*\barray\b|=\s*array\b)"
                            r"|s(?<!\ws)truct\s+\w+\s*\{[^}]*\barray\b")
_WORD = re.compile(r"\w")
_WORD_OR_DOT = re.compile(r"[\w.]")


def _starts_word(text: str, at: int, before=_WORD) -> bool:
    """Is text[at] not preceded by a character `before` matches (a word's: \\b before a letter)?"""
    return not at or not before.match(text, at - 1)


def bracket_end(code: str, i: int, opening: str, closing: str) -> int:
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


def _fixed(code: str, divisors: bool = True) -> list:
    """Spans of `code` (comments stripped) where a literal must stay a constant: const
    statements, attributes, case labels, array<...> templates (a shift's '>>' inside parentheses
    skipped), and the right operand of every division or remainder (by a constant, a multiply and
    a shift; by a uniform, a long sequence)."""
    spans = [m.span() for m in _CONST_STMT.finditer(code)] + [m.span() for m in _ATTRIBUTE.finditer(code)]
    if "case" in code:
        spans += [m.span() for m in _CASE.finditer(code)]
    for m in _ARRAY.finditer(code):
        if _starts_word(code, m.start()):
            spans.append((m.start(), bracket_end(code, m.end(), "<", ">")))
    for m in _DIVIDES.finditer(code) if divisors else ():
        i = m.end()
        if code.startswith("(", i):
            spans.append((i, bracket_end(code, i + 1, "(", ")")))
        else:  # a name or literal, maybe indexed or called: up to the next operator or delimiter
            word = _DIVISOR.match(code, i)
            end = word.end() if word else i
            if word and code[end - 1] in "[(":
                end = bracket_end(code, end, code[end - 1], "]" if code[end - 1] == "[" else ")")
            spans.append((i, end))
    return spans


def skeleton(code: str, quick: bool = False, divisors: bool = True):
    """(text without comments, [(start, end, value)] of its liftable literals, the text with
    them blanked), or None where nothing may be lifted. `quick`: as the quick tier lifts
    (quick_tier): templates marked FIXED too, u32 constants written into their uses, divisors,
    f32 literals (`f32(1e-05)`: value its bits; SD-1.5's 31 add+mul+pow kernels, of its norms,
    differ in such constants) and typed i32 ones (`3i`: convolutions' padding and image sizes,
    slices' offsets; the value is the digits, a minus stays in the text). `divisors`: the quick
    tier lifts divisors too (CompileOptions.quick_divisors)."""
    if NAME in code or (FIXED in code and not quick):  # (NAME: lifted already)
        return None
    text = COMMENT.sub("", code)
    if not (quick and LOOPED in code) and _PRIVATE_ARRAY.search(text):
        return None
    if quick:
        text = _inline_constants(text)
    fixed = _fixed(text, divisors=not (quick and divisors))
    blocked = bytearray(len(text))
    for lo, hi in fixed:
        blocked[lo:hi] = b"\x01" * (hi - lo)
    found = _literals(text, _LITERAL, blocked)
    if quick:
        found = sorted(found + [(m.start(), m.end(), bits) for m in _F32_LITERAL.finditer(text)
                                if not blocked[m.start()] and _starts_word(text, m.start())
                                and (bits := _f32_bits(m.group(1))) is not None]
                       + [f for f in _literals(text, _I32_LITERAL, blocked) if f[2] < 1 << 31])
    if not found:
        return None
    parts, at = [], 0
    for lo, hi, _ in found:
        parts.append(text[at:lo])
        parts.append(_kind(text, lo, hi))  # (kernels differing in a literal's type stay apart)
        at = hi
    parts.append(text[at:])
    return text, found, "".join(parts)


def _literals(text: str, suffix, blocked: bytearray) -> list:
    """(start, end, value) of each literal outside `blocked`: digits (not after a letter, digit or
    '.') and the suffix `suffix` finds, ending a word. (Found from the suffix, which is rarer than
    a digit.)"""
    found = []
    for m in suffix.finditer(text):
        end = m.start()
        start = end
        while start and text[start - 1].isdecimal():  # (\d)
            start -= 1
        if start < end and not blocked[start] and _starts_word(text, start, _WORD_OR_DOT):
            found.append((start, end + 1, int(text[start:end])))
    return found


class Skeletons:
    """skeleton() of kernel texts, each worked out once: quick_tier and lift ask for the same
    ones. Made for one package's kernels and dropped with them."""

    def __init__(self):
        self._known = {}

    def __call__(self, code: str, quick: bool = False, divisors: bool = True):
        key = (code, quick, divisors)
        if key not in self._known:
            self._known[key] = skeleton(code, quick, divisors)
        return self._known[key]


def lifted_kernel(text: str, found: list, columns: list, members: int, bindings: int) -> str:
    """`text` with the literals at `columns` (indices into `found`) read from mn_sizes."""
    out, at = [], 0
    for j, col in enumerate(columns):
        lo, hi, _ = found[col]
        out.append(text[at:lo])
        ref = f"{NAME}[{j // 4}u][{j % 4}u]"
        out.append({"~": f"bitcast<f32>({ref})", "$": f"i32({ref})"}.get(_kind(text, lo, hi), ref))
        at = hi
    out.append(text[at:])
    head = (f"// One kernel for {members} that differ only in literals (sizes, constants): those read from {NAME} "
            f"(compiler/lift_sizes.py).\n"
            f"@group(0) @binding({bindings}) var<uniform> {NAME}: array<vec4<u32>, {-(-len(columns) // 4)}>;\n")
    return head + "".join(out)


def _joined(kernels: list, members: list, shapes: dict, **fields) -> tuple | None:
    """(one kernel for `members`, reading the literals that differ between them from mn_sizes,
    with `fields` over the first member's; member -> its values), or None where none differ or
    more than MAX_LIFTED do."""
    found = [shapes[i][1] for i in members]
    columns = [c for c in range(len(found[0])) if len({f[c][2] for f in found}) > 1]
    if not columns or len(columns) > MAX_LIFTED:
        return None
    first = kernels[members[0]]
    text = lifted_kernel(shapes[members[0]][0], found[0], columns, len(members), len(first["access"]))
    kernel = {**first, **fields, "wgsl": text, "lifted": len(columns), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    return kernel, {i: [f[c][2] for c in columns] for i, f in zip(members, found)}


def _kind(text: str, lo: int, hi: int) -> str:
    """A liftable literal's mark in a skeleton: # u32, ~ f32 (its bits), $ i32."""
    return "~" if text.startswith("f32(", lo) else "$" if text[hi - 1] == "i" else "#"


def _f32_bits(literal: str):
    """An f32 literal's bits as a u32, or None where it does not fit an f32 (WGSL refuses it)."""
    try:
        return struct.unpack("<I", struct.pack("<f", float(literal)))[0]
    except OverflowError:
        return None


def _family(k: dict, sk: tuple, label: bool = True) -> tuple:
    """What the members of one family share. (The label too, but in the quick tier: profiles
    group time by it, and "x3" says how many tensors a kernel covers.)"""
    return (sk[2], k.get("label", "") if label else "", k["entry"], tuple(k["workgroup_size"]),
            tuple(k["access"]), len(sk[1]))


def _inline_constants(text: str) -> str:
    """`text` with each u32 constant (`const TG: u32 = 16u;`) written into its uses instead,
    where they may then be lifted; a name declared twice with different values stays."""
    if "const" not in text:
        return text
    values = {}
    for m in _U32_CONST.finditer(text):
        values.setdefault(m.group(1), set()).add(m.group(2))
    # (a name also declared some other way, a parameter, a field, a let, stays: its uses are not all the constant's)
    declared = {m.group(1) or m.group(2) for m in _DECLARED.finditer(text)} if values else set()
    values = {name: v.pop() for name, v in values.items() if len(v) == 1 and name not in declared}
    if not values:
        return text
    text = _U32_CONST.sub(lambda m: "" if m.group(1) in values else m.group(0), text)
    uses = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, values)) + r")\b")
    return uses.sub(lambda m: values[m.group(1)] + "u", text)


def each_entry(programs: dict, moved) -> dict:
    """`programs` with moved(entry) for every dispatch and every variant of one."""
    return {name: {**p, "dispatches": [
        {**moved(d), **({"variants": {c: moved(v) for c, v in d["variants"].items()}} if "variants" in d else {})}
        for d in p["dispatches"]]} for name, p in programs.items()}


def lift(kernels: list, programs: dict, options: CompileOptions = DEFAULT, skeletons: Skeletons | None = None) -> tuple:
    """(kernels, programs) with each family of size variants as one kernel; dispatches (and
    their device-class variants) of a family's members name its kernel and carry "lifted",
    their values. Kernels no dispatch uses any more are dropped."""
    if not options.lift_sizes:
        return kernels, programs
    skeletons = skeletons or Skeletons()
    families = {}
    shapes = {}
    for i, k in enumerate(kernels):
        sk = skeletons(k["wgsl"])
        if sk is None:
            continue
        shapes[i] = sk
        families.setdefault(_family(k, sk), []).append(i)
    new_kernels = list(kernels)
    remap = {}  # old kernel -> (family kernel, its lifted values)
    for members in families.values():
        joined = _joined(kernels, members, shapes) if len(members) > 1 else None
        if joined is not None:
            new_kernels.append(joined[0])
            remap.update((i, (len(new_kernels) - 1, values)) for i, values in joined[1].items())
    if not remap:
        return kernels, programs
    # the members go (every kernel is some dispatch's: the writer adds them so), the families stay
    kept = [i for i in range(len(new_kernels)) if i not in remap]
    index = {old: new for new, old in enumerate(kept)}

    def moved(entry):
        k, values = remap.get(entry["kernel"], (entry["kernel"], None))
        return {**entry, "kernel": index[k], **({"lifted": values} if values is not None else {})}
    return [new_kernels[i] for i in kept], each_entry(programs, moved)


def quick_tier(kernels: list, programs: dict, options: CompileOptions = DEFAULT,
               skeletons: Skeletons | None = None) -> tuple:
    """(kernels, programs) with each dispatch's "quick" variant where the quick tier (runtime
    Session(quick_start=True): the driver compiles few, cheap kernels first, the tuned ones
    behind them) has one: what it runs is a dispatch's own quick variant (a GEMM's
    igemm_quick) or else its kernel, lifted further than `lift` dares, divisors and constants
    too (a division by a uniform is a long sequence, but only until the tuned kernel has
    compiled). A family joins kernels that `lift` keeps apart, or it is not made. Run before
    `lift`; kernels no entry names any more are dropped."""
    if not options.lift_sizes:
        return kernels, programs

    def subject(d):  # the kernel the quick tier would run unless a family takes it
        return as_variant(d, QUICK)

    skeletons = skeletons or Skeletons()
    families, shapes = {}, {}
    for i in sorted({subject(d)["kernel"] for p in programs.values() for d in p["dispatches"]}):
        sk = skeletons(kernels[i]["wgsl"], quick=True, divisors=options.quick_divisors)
        if sk is not None:
            shapes[i] = sk
            families.setdefault(_family(kernels[i], sk, label=False), []).append(i)
    new_kernels, remap = list(kernels), {}
    for members in families.values():
        plain = {(i,) if sk is None else _family(kernels[i], sk)
                 for i, sk in ((i, skeletons(kernels[i]["wgsl"])) for i in members)}
        label = kernels[members[0]].get("label", "")
        joined = _joined(kernels, members, shapes, label=label if label.endswith(f"({QUICK})") else f"{label} ({QUICK})") \
            if len(plain) > 1 else None
        if joined is not None:
            new_kernels.append(joined[0])
            remap.update((i, (len(new_kernels) - 1, values)) for i, values in joined[1].items())

    def with_quick(d):
        s = subject(d)
        if s["kernel"] not in remap:
            return d
        k, values = remap[s["kernel"]]
        return {**d, "variants": {**d.get("variants", {}),
                                  QUICK: {"kernel": k, "workgroups": s["workgroups"], "lifted": values}}}
    programs = {name: {**p, "dispatches": [with_quick(d) for d in p["dispatches"]]} for name, p in programs.items()}
    named = sorted({e["kernel"] for p in programs.values() for d in p["dispatches"]
                    for e in (d, *d.get("variants", {}).values())})
    index = {old: new for new, old in enumerate(named)}

    def moved(e):
        return {**e, "kernel": index[e["kernel"]]}
    return [new_kernels[i] for i in named], each_entry(programs, moved)

"""docs/ONNX.md's generated sections: the op table (from compiler/onnx/coverage.py and the
node tests' results) and every node test that does not pass, with its reason.

test_onnx_backend.py calls `check` after a full run: a section that differs from what the
importer and the suite give now fails the test. `MEGANEURA_ONNX_DOC=write` rewrites them.
"""
from __future__ import annotations

import collections
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "ONNX.md"
FLOATS = {1, 10, 16}  # FLOAT, FLOAT16, BFLOAT16
PASSED = ("passed", "specialized")


def _mark(name):
    return (f"<!-- generated: {name} (tests/compiler/onnx_doc.py; MEGANEURA_ONNX_DOC=write to remake) -->",
            f"<!-- end generated: {name} -->")


def _op_key(node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def _per_op(cases, results):
    """op -> {"total", "passed", "versions", "float"} over the node tests of that op (the
    '_expanded' variants, which spell an op out in others, are left out)."""
    import onnx.defs

    stats = collections.defaultdict(lambda: {"total": 0, "passed": 0, "versions": set(), "float": False})
    for name, model, *_ in cases:
        if "_expanded" in name or name not in results:
            continue
        g = model.graph
        inits = {i.name for i in g.initializer}
        floats = (any(vi.type.tensor_type.elem_type in FLOATS for vi in g.input if vi.name not in inits)
                  and any(vi.type.tensor_type.elem_type in FLOATS for vi in g.output))
        opsets = {o.domain or "": o.version for o in model.opset_import}
        for node in g.node:
            s = stats[_op_key(node)]
            s["total"] += 1
            if results[name][0] in PASSED:
                s["passed"] += 1
                s["float"] |= floats
                try:
                    schema = onnx.defs.get_schema(node.op_type, opsets.get(node.domain, 1), node.domain)
                    s["versions"].add(schema.since_version)
                except Exception:  # noqa: BLE001  (an op this onnx does not define)
                    pass
    return stats


def _limit(text: str) -> str:
    text = re.sub(r"^node …: ", "", text)
    text = re.sub(r"^ONNX op … \(node …\) ", "", text)
    return text.replace("|", "\\|")


def ops_section(cases, results) -> str:
    from meganeura.compiler.onnx.coverage import coverage

    stats = _per_op(cases, results)
    rows = ["| op | computed | gradient | node tests passed | verified opset versions | refuses |",
            "| --- | --- | --- | --- | --- | --- |"]
    for c in coverage():
        s = stats.get(c.op, {"total": 0, "passed": 0, "versions": set(), "float": False})
        where = "in the graph" if c.in_graph else "at import (known inputs)"
        grad = ("yes" if s["float"] else "—") if c.in_graph else "—"
        tests = f"{s['passed']} / {s['total']}" if s["total"] else "—"
        versions = ", ".join(map(str, sorted(s["versions"]))) or "—"
        refuses = "; ".join(_limit(t) for t in c.limits) or ""
        rows.append(f"| {c.op} | {where} | {grad} | {tests} | {versions} | {refuses} |")
    return "\n".join(rows)


def _reason(detail: str) -> str:
    """A reason with the node's and values' names taken out, so that equal reasons group."""
    return re.sub(r"'[^']*'", "…", detail.split(" | ")[0]).replace("|", "\\|")[:160]


def tests_section(results, allowed: dict) -> str:
    counts = collections.Counter(s for s, _ in results.values())
    passed = counts["passed"] + counts["specialized"]
    out = [f"| | node tests |", "| --- | --- |", f"| passed | **{passed}** ({counts['specialized']} specialized) |",
           f"| failed, allowed | {counts['failed']} |", f"| not supported | {counts['unsupported']} |",
           f"| all | {len(results)} |", ""]
    if allowed:
        out += ["Allowed failures (the suite's expectation is off; `ALLOWED` in the test):", ""]
        out += [f"- `{k}`: {v}" for k, v in sorted(allowed.items())] + [""]
    groups = collections.defaultdict(list)
    for name, (status, detail) in results.items():
        if status == "unsupported":
            groups[_reason(detail)].append(name)
    out += ["Not supported, by reason:", "", "| reason | tests |", "| --- | --- |"]
    for reason, names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        listed = ", ".join(f"`{n.removeprefix('test_')}`" for n in sorted(names))
        out.append(f"| {reason} ({len(names)}) | {listed} |")
    return "\n".join(out)


def check(cases, results, allowed: dict, write: bool) -> list:
    """Names of docs/ONNX.md's generated sections that are stale (after rewriting them, if `write`)."""
    text = DOC.read_text()
    stale = []
    for name, body in (("ops", ops_section(cases, results)), ("node tests", tests_section(results, allowed))):
        start, end = _mark(name)
        if start not in text or end not in text:
            stale.append(name)
            continue
        head, rest = text.split(start, 1)
        old, tail = rest.split(end, 1)
        if old.strip() != body.strip():
            stale.append(name)
            text = f"{head}{start}\n{body}\n{end}{tail}"
    if write:
        DOC.write_text(text)
    return stale

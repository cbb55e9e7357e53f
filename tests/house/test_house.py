"""The house rules, checked on the source: the rooms' imports, private names, function sizes.

Reads the code with `ast` only (imports nothing), so it runs in a second. The line counts per
room print with `pytest -s tests/house`: a budget makes growth a decision.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROOMS = {"compiler": "meganeura.compiler", "runtime": "meganeura.runtime",
         "engine_bridge": "meganeura.engine_bridge"}
MAX_FUNCTION_LINES = 80
# lines of Python per room (docstrings and comments included): raise one on purpose, not by drift
LINE_BUDGET = {"compiler": 15000, "runtime": 4000, "engine_bridge": 1700}


def _modules():
    """Every module of the rooms: dotted name -> (path, parsed tree)."""
    out = {}
    for room, package in ROOMS.items():
        for path in sorted((ROOT / room).rglob("*.py")):
            rel = path.relative_to(ROOT / room).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            out[name] = (path, ast.parse(path.read_text(), str(path)))
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name][0].name == "__init__.py"


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The dotted name an ImportFrom in `module` refers to."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, tree):
    """(imported module, names taken from it, line) for each import in `module`, at any depth."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, (), node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, node)
            names = tuple(a.name for a in node.names)
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            for sub in submodules:
                yield sub, (), node.lineno
            rest = tuple(n for n in names if f"{target}.{n}" not in MODULES)
            if rest or not submodules:
                yield target, rest, node.lineno


def _graph():
    edges = {m: set() for m in MODULES}
    for m, (_, tree) in MODULES.items():
        for target, _, _ in _imports(m, tree):
            if target in MODULES and target != m:
                edges[m].add(target)
    return edges


def _cycles(edges):
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_rooms_keep_their_walls():
    """runtime/ never imports compiler/ or engine_bridge/; compiler/ never imports wgpu."""
    bad = []
    for m, (path, tree) in MODULES.items():
        for target, _, line in _imports(m, tree):
            if m.startswith("meganeura.runtime") and target.startswith(
                    ("meganeura.compiler", "meganeura.engine_bridge")):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
            if m.startswith("meganeura.compiler") and target.split(".")[0] == "wgpu":
                bad.append(f"{path.relative_to(ROOT)}:{line} imports wgpu")
    assert not bad, "\n".join(bad)


def test_no_private_names_across_modules():
    """A name starting with one underscore belongs to its module: nothing imports it."""
    bad = []
    for m, (path, tree) in MODULES.items():
        for target, names, line in _imports(m, tree):
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {n} from {target}")
    assert not bad, f"{len(bad)} private imports:\n" + "\n".join(bad)


def _long_functions():
    for m, (path, tree) in MODULES.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    yield f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)"


def test_functions_fit_on_a_screen():
    long = list(_long_functions())
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_rooms_within_their_line_budget():
    counts = {}
    for room in ROOMS:
        counts[room] = sum(len(p.read_text().splitlines()) for p in (ROOT / room).rglob("*.py"))
    print("\nlines of Python per room: " + ", ".join(f"{r} {n}" for r, n in counts.items()))
    over = {r: (n, LINE_BUDGET[r]) for r, n in counts.items() if n > LINE_BUDGET[r]}
    assert not over, f"rooms over their budget (lines, budget): {over}"


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_no_process_wide_switches(room):
    """An embeddable library leaves the host's interpreter settings alone unless asked."""
    bad = []
    for path in (ROOT / room).rglob("*.py"):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if "sys.setswitchinterval(" in line and "host_switch_interval" not in line:
                bad.append(f"{path.relative_to(ROOT)}:{i}")
    assert not bad, "sys.setswitchinterval outside the opt-in option:\n" + "\n".join(bad)

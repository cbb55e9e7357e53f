"""What the importer covers, read off its own tables and code: every ONNX op it imports,
whether the op runs in the graph or only folds at import time, and the limits its
builder states (the NotImplementedError messages in the builder and the helpers of its
module that it calls). docs/ONNX.md's op table is made from this
(tests/compiler/test_onnx_backend.py checks that it is current), so it cannot drift.
"""
from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class OpCoverage:
    op: str
    in_graph: bool  # built as graph ops (else only folded, on inputs known at import)
    folded: bool  # folded with numpy when all its inputs are known
    limits: tuple  # what the builder refuses, in its own words ("…" where a value goes)


def coverage() -> list:
    """OpCoverage of every op the importer knows, sorted by name."""
    from .importer import supported_ops
    from .tables import BUILD, FOLD

    return [OpCoverage(op, op in BUILD, op in FOLD or op in ("Shape", "Size"),
                       tuple(refusals(BUILD[op])) if op in BUILD else ())
            for op in supported_ops()]


def refusals(fn) -> list:
    """The NotImplementedError messages that `fn` (or a function of its own module that it
    calls, transitively) raises, in order, without repeats."""
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    seen, out = set(), []
    _collect(fn, module, seen, out, depth=0)
    return list(dict.fromkeys(out))


def _collect(fn, module, seen, out, depth):
    tree = _tree(fn)
    if tree is None or depth > 3:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and \
                getattr(node.exc.func, "id", None) == "NotImplementedError" and node.exc.args:
            text = _text(node.exc.args[0])
            if text:
                out.append(text)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and module is not None:
            callee = getattr(module, node.func.id, None)
            if inspect.isfunction(callee) and callee.__module__ == module.__name__ and callee not in seen:
                seen.add(callee)
                _collect(callee, module, seen, out, depth + 1)


def _tree(fn):
    """The parsed source of `fn`, or None (a builtin, or a lambda inside a larger expression)."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    try:
        return ast.parse(src)
    except SyntaxError:  # a lambda in a dict or call: its line alone is not a statement
        try:
            return ast.parse(src.strip().rstrip(",").split(":", 1)[-1].strip())
        except SyntaxError:
            return None


def _text(node) -> str:
    """A message's text: string parts kept, formatted values as '…'."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    return ""

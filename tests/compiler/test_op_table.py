"""The op table is complete: every row has what the compiler needs, and a test case.

Walks compiler.ops.OPS. A row fails when it lacks a shape rule, a lowering of a known
kind, a numpy reference (leaves excepted) or a gradient rule (unless the op is in
NOT_DIFFERENTIABLE); when an elementwise lowering names an operand the op does not have
(or leaves one unused), a format field codegen never fills, or a prelude helper that
does not exist; and when test_ops.py has no case for it.
"""
from __future__ import annotations

import importlib.util
import inspect
import re
import string
import sys
from pathlib import Path

import pytest
from meganeura.compiler.codegen import kernels as codegen, wgsl
from meganeura.compiler.ir.graph import LEAF_OPS
from meganeura.compiler.ir.ops import NOT_DIFFERENTIABLE, OPS
from meganeura.compiler.passes.prepare import prepare
from meganeura.compiler.passes.records import Kernel

KINDS = ("elementwise", "view", "kernel", "decompose", "leaf")
PRELUDE = wgsl.template("prelude")
ALL = sorted(OPS)
NON_LEAF = [n for n in ALL if OPS[n].lowering[:1] != ("leaf",)]


def _test_ops():
    """tests/compiler/test_ops.py as a module (the one pytest imported, if it did)."""
    path = Path(__file__).with_name("test_ops.py").resolve()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f and Path(f).resolve() == path:
            return mod
    spec = importlib.util.spec_from_file_location("_meganeura_test_ops_cases", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _variants(low):
    """The WGSL expression(s) of an elementwise lowering: one string, or one per attribute value."""
    return list(low[1].items()) if isinstance(low[1], dict) else [(None, low[1])]


def _fields(expr):
    out = set()
    for _, name, _, _ in string.Formatter().parse(expr):
        if name is not None:
            out.add(int(name) if name.isdigit() else name)
    return out


_ARITY = None


def _arities():
    """op -> set of input counts seen in the graphs of test_ops.py's cases (forward,
    gradient, and after prepare's decompositions)."""
    global _ARITY
    if _ARITY is None:
        t = _test_ops()
        graphs = [t.build_case(c)[0] for c in t.CASES] + [_fwd_graph(t, c) for c in t.FWD_CASES]
        seen = {}
        for g in graphs:
            for gg in (g, prepare(g)):
                for n in gg.nodes:
                    seen.setdefault(n.op, set()).add(len(n.inputs))
        _ARITY = seen
    return _ARITY


def _fwd_graph(t, case):
    from meganeura.compiler.ir.builder import Builder

    b = Builder()
    ts = {k: b.input(k, v.shape, t._dtype(v)) for k, v in case.inputs.items()}
    b.output("out", case.build(b, ts))
    return b.g


# ------------------------------------------------------------------ the walk
def test_table_is_not_empty_and_names_match():
    assert len(OPS) >= 30
    for name, r in OPS.items():
        assert r.name == name, f"row {name!r} calls itself {r.name!r}"


def test_not_differentiable_names_rows():
    unknown = sorted(NOT_DIFFERENTIABLE - set(OPS))
    assert not unknown, f"NOT_DIFFERENTIABLE names ops that have no row: {unknown}"


def test_leaves():
    leaves = {n for n in ALL if OPS[n].lowering[0] == "leaf"}
    assert leaves == set(LEAF_OPS), f"leaf rows {sorted(leaves)} != ir.LEAF_OPS {sorted(LEAF_OPS)}"


@pytest.mark.parametrize("name", ALL)
def test_row_is_complete(name):
    r = OPS[name]
    problems = []
    if not callable(r.shape_rule):
        problems.append("no shape rule")
    low = r.lowering
    if not isinstance(low, tuple) or not low or low[0] not in KINDS:
        problems.append(f"lowering {low!r} is not one of {KINDS}")
    else:
        kind = low[0]
        want_len = {"elementwise": 2, "view": 1, "kernel": 2, "decompose": 2, "leaf": 1}[kind]
        if kind == "kernel" and len(low) == 3 and callable(low[2]) and r.gradient is not None:
            pass  # a kernel forward whose gradient differentiates this decomposition
        elif len(low) != want_len:
            problems.append(f"a {kind} lowering has {want_len} items, got {low!r}")
        elif kind == "elementwise" and not (isinstance(low[1], str) or (
                isinstance(low[1], dict) and low[1] and all(isinstance(v, str) for v in low[1].values()))):
            problems.append(f"elementwise lowering is not a WGSL expression (or a dict of them): {low[1]!r}")
        elif kind == "decompose" and not callable(low[1]):
            problems.append(f"decompose lowering has no decomposition function: {low[1]!r}")
        elif kind == "kernel":
            problems += _kernel_known(low[1])
    leaf = isinstance(low, tuple) and low[:1] == ("leaf",)
    if leaf:
        if r.reference is not None:
            problems.append("a leaf has a numpy reference")
        if name not in NOT_DIFFERENTIABLE:
            problems.append("a leaf is missing from NOT_DIFFERENTIABLE")
    elif not callable(r.reference):
        problems.append("no numpy reference")
    if name in NOT_DIFFERENTIABLE:
        if r.gradient is not None:
            problems.append("in NOT_DIFFERENTIABLE but has a gradient rule (autodiff never calls it)")
    elif not callable(r.gradient):
        problems.append("no gradient rule, and not in NOT_DIFFERENTIABLE")
    assert not problems, f"op {name}: " + "; ".join(problems)


def _kernel_known(kind):
    """codegen.generate dispatches on the kernel kind: an unknown one is a KeyError there."""
    if not isinstance(kind, str) or not kind:
        return [f"kernel lowering names no kernel: {kind!r}"]
    try:
        codegen.generate(None, Kernel(kind, []))
    except KeyError as exc:
        unknown = bool(exc.args) and exc.args[0] == kind
    except Exception:  # noqa: BLE001 - a known kind, called with nothing to generate: it fails inside
        unknown = False
    else:
        unknown = False
    return [f"codegen has no kernel {kind!r}"] if unknown else []


ELEMENTWISE = [n for n in ALL if OPS[n].lowering[0] == "elementwise"]


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_lowering_uses_existing_operands(name):
    low = OPS[name].lowering
    src = inspect.getsource(codegen.ew_code)  # fills the named holes of elementwise lowerings
    arities = _arities().get(name)
    problems = []
    for key, expr in _variants(low):
        where = f"{name}" + (f"[{key}]" if key is not None else "")
        fields = _fields(expr)
        pos = sorted(f for f in fields if isinstance(f, int))
        if pos != list(range(len(pos))):
            problems.append(f"{where}: operands {pos} are not 0..n-1 ({expr!r})")
        named = sorted(f for f in fields if isinstance(f, str))
        for f in named:
            if f'"{f}"' not in src:
                problems.append(f"{where}: codegen never fills {{{f}}} ({expr!r})")
        if arities is None:
            problems.append(f"{where}: no case in test_ops.py builds this op, so its arity is unknown")
        else:
            for a in sorted(arities):
                if len(pos) != a:
                    problems.append(f"{where}: the op takes {a} inputs, the lowering uses {pos} ({expr!r})")
        for helper in sorted(set(re.findall(r"\b(mn_\w+)\s*\(", expr))):
            if not re.search(rf"\bfn {helper}\s*\(", PRELUDE):
                problems.append(f"{where}: {helper} is not defined in prelude.wgsl")
        try:
            expr.format(*[f"x{i}" for i in range(max(pos, default=-1) + 1)],
                        **{f: "1.0" for f in named})
        except (IndexError, KeyError, ValueError) as exc:
            problems.append(f"{where}: the expression does not format: {exc}")
        if expr.count("(") != expr.count(")"):
            problems.append(f"{where}: unbalanced parentheses in {expr!r}")
    assert not problems, "\n".join(problems)


def test_dict_lowerings_cover_their_attribute_values():
    """gelu / gelu_grad pick by `approximate`, cast by `to`: every value the ops take has a
    WGSL expression (codegen indexes the dict with the attribute, default 'none')."""
    expect = {"gelu": {"none", "tanh"}, "gelu_grad": {"none", "tanh"}, "cast": {"f32", "i32"}}
    for name, keys in expect.items():
        low = OPS[name].lowering[1]
        assert isinstance(low, dict) and set(low) >= keys, f"{name}: lowering keys {sorted(low)} lack {keys}"


def test_every_op_has_a_case():
    t = _test_ops()
    fb = {c.op for c in t.CASES}
    fwd = {c.op for c in t.FWD_CASES}
    unknown = sorted((fb | fwd) - set(OPS))
    assert not unknown, f"test_ops.py has cases for ops the table lacks: {unknown}"
    missing = []
    for name in NON_LEAF:
        if name in NOT_DIFFERENTIABLE:
            if name not in fb | fwd:
                missing.append(f"{name} (forward)")
        elif name not in fb:
            missing.append(f"{name} (forward and backward)" + (" [has only a forward case]" if name in fwd else ""))
    assert not missing, f"ops with no case in tests/compiler/test_ops.py: {missing}"


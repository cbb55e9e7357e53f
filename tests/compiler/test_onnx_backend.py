"""ONNX backend conformance: the node tests of the ONNX backend test suite, imported,
compiled and run on the GPU device, compared with the suite's expected outputs.

The suite's node tests come from the installed `onnx` package: its data directory
(onnx/backend/test/data/node/*/model.onnx with test_data_set_*/) where the wheel ships
it, else the same test cases generated in memory by onnx.backend.test.case.node.

Every node test is classified:
  passed         the GPU outputs match the expected ones (the suite's rtol 1e-3, atol 1e-7)
  failed         anything else; the test fails unless the case is in ALLOWED below
  not supported  import raised NotImplementedError, or an input/output has an element
                 type that meganeura does not compute (double, float8/4, int2/4, strings,
                 sequences, ...) or integers beyond 32 bits
A model whose op reads an attribute-like input (Reshape's shape, Slice's starts, Pad's
pads, Resize's scales, Clip's bounds, ...) that the test feeds as a graph input is
specialized: that input's test value becomes an initializer ("passed, specialized"),
as a compiler for fixed shapes must.

`pytest -s` prints the counts and every failure; docs/ONNX.md records them.
"""
from __future__ import annotations

import collections
import os
import re
import time
import warnings

import numpy as np

import onnx_doc  # (docs/ONNX.md's generated sections)

import onnx  # noqa: E402  (the test extra installs it)
from meganeura.compiler import compile_graph, run_graph
from meganeura.compiler.onnx_import import load_onnx
from onnx import TensorProto, numpy_helper
from onnx.backend.base import Backend, BackendRep

# node test -> why its failure is accepted (a semantic meganeura deliberately differs on);
# docs/ONNX.md lists them too.
_FFT32 = ("the expected output holds numpy's complex64 FFT rounding (1.9e-7 where the exact value is 0, "
          "beyond the suite's atol of 1e-7); meganeura's matches the exact transform")
ALLOWED: dict = {"test_dft_inverse": _FFT32, "test_dft_inverse_opset19": _FFT32}

# element types a Session takes and returns: float16 and bfloat16 computed in f32, integers of
# every width in i32 (values beyond 32 bits are refused), bool as 0 / 1
IN_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.BOOL, TensorProto.INT8,
            TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32, TensorProto.UINT32,
            TensorProto.INT64, TensorProto.UINT64}
# float8 / float4 / e8m0 computed in f32 and 4- / 2-bit integers in i32, converted (rounded) at the boundary
IN_TYPES |= {TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ,
             TensorProto.FLOAT8E8M0, TensorProto.FLOAT4E2M1, TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2,
             TensorProto.UINT2}
OUT_TYPES = IN_TYPES
# outputs of a type with fewer digits than the suite's rtol asks: computed in f32 and rounded
# once, they may lie two units in the last place (relative 2^-7 .. 2^-6) from a reference that
# rounds to that type at every step (attention in bfloat16 does, over a softmax and two matmuls)
ULP_RTOL = {TensorProto.BFLOAT16: 2.0 ** -6}
_CONSTANT = re.compile(r"\('([^']+)'\) must be a constant")


class MeganeuraRep(BackendRep):
    """A prepared model: imported, compiled, and loaded into a Session on the device."""

    def __init__(self, model, device, baked=()):
        from meganeura.runtime import Package, Session

        self.model = load_onnx(model)
        self.baked = tuple(baked)
        self.graph = self.model.graph
        self.session = Session(device, Package.from_bytes(compile_graph(self.graph)))

    def run(self, inputs, **kwargs):
        # ONNX inputs may hold inf/NaN on purpose (attention masks, isinf/isnan tests)
        outs = self.session.run("infer", dict(zip(self.graph.inputs, inputs)), check_finite=False)
        return tuple(outs[k] for k in self.graph.outputs)


class MeganeuraBackend(Backend):
    """onnx.backend.base.Backend over meganeura: `device` is a wgpu device (None: the
    default one). Inputs that the importer needs as constants are baked into the model
    from `inputs` when given (see `specialize`)."""

    @classmethod
    def supports_device(cls, device):
        return device in ("CPU", "GPU", None) or not isinstance(device, str)

    @classmethod
    def prepare(cls, model, device=None, inputs=None, **kwargs):
        if inputs is not None and not isinstance(inputs, dict):
            inputs = dict(zip([vi.name for vi in model.graph.input], inputs))
        baked = []
        while True:
            try:
                return MeganeuraRep(model, device, baked)
            except NotImplementedError as exc:
                model, name = specialize(model, exc, inputs)
                if name is None:
                    raise
                baked.append(name)

    @classmethod
    def run_model(cls, model, inputs, device=None, **kwargs):
        return cls.prepare(model, device, inputs).run(inputs)


def specialize(model, exc, inputs: dict | None):
    """(model with one more graph input made an initializer, its name), or (model, None)."""
    m = _CONSTANT.search(str(exc))
    if m is None or inputs is None or m.group(1) not in {vi.name for vi in model.graph.input}:
        return model, None
    name = m.group(1)
    value = inputs[name]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [vi for vi in out.graph.input if vi.name != name]
    del out.graph.input[:]
    out.graph.input.extend(keep)
    out.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return out, name


# ------------------------------------------------------------------ the cases
def _cases(root=None):
    """[(name, model, [(inputs, outputs), ...], rtol, atol)] for every node test."""
    import onnx.backend.test

    root = root or os.path.join(os.path.dirname(onnx.backend.test.__file__), "data", "node")
    if os.path.isdir(root):
        out = []
        for name in sorted(os.listdir(root)):
            d = os.path.join(root, name)
            model = onnx.load(os.path.join(d, "model.onnx"))
            sets = [(_read_set(os.path.join(d, ds), "input_"), _read_set(os.path.join(d, ds), "output_"))
                    for ds in sorted(x for x in os.listdir(d) if x.startswith("test_data_set"))]
            out.append((name, model, sets, 1e-3, 1e-7))
        return out
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    return [(c.name, c.model, [tuple([_array(a) for a in part] for part in ds) for ds in c.data_sets],
             c.rtol, c.atol) for c in cases if c.model is not None and c.data_sets]


def _array(a):
    if isinstance(a, TensorProto):  # (how the generated cases hold float16 / bfloat16 casts' data)
        return numpy_helper.to_array(a)
    return np.asarray(a) if isinstance(a, (np.ndarray, np.generic)) else a


def _read_set(folder, kind):
    files = sorted((f for f in os.listdir(folder) if f.startswith(kind)), key=lambda f: int(re.sub(r"\D", "", f) or 0))
    return [_read_pb(os.path.join(folder, f)) for f in files]


def _read_pb(path):
    t = TensorProto()
    with open(path, "rb") as fh:
        t.ParseFromString(fh.read())
    return numpy_helper.to_array(t)


def _types_unsupported(model, sets):
    g = model.graph
    for vi, kind, allowed in [(vi, "input", IN_TYPES) for vi in g.input if vi.name not in
                              {i.name for i in g.initializer}] + [(vi, "output", OUT_TYPES) for vi in g.output]:
        if not vi.type.HasField("tensor_type"):
            return f"{kind} {vi.name!r} is not a tensor"
        t = vi.type.tensor_type.elem_type
        if t not in allowed:
            return f"{kind} {vi.name!r} has type {TensorProto.DataType.Name(t)}"
    for ins, outs in sets:
        for k, a in enumerate(list(ins) + list(outs)):
            if not isinstance(a, np.ndarray):
                return "a non-tensor value"
            if a.dtype.kind in "iu" and a.size and (a.min() < -(2 ** 31) or a.max() >= 2 ** 31):
                return "integers outside the 32-bit range"
            # (an empty input reaches the importer: it refuses one, unless read only for its type)
            if a.size == 0 and k >= len(ins):
                return "an empty tensor"
    return None


def _mismatch(got, want, rtol, atol):
    """None when got matches want (NaN where want is NaN), else a short description."""
    want = np.asarray(want)
    if want.dtype == np.bool_:
        want = want.astype(np.float32)
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    with np.errstate(invalid="ignore"):
        w, g = want.astype(np.float64), got.astype(np.float64)
        bad = ~((np.abs(g - w) <= atol + rtol * np.abs(w)) | (np.isnan(w) & np.isnan(g)) | (g == w))
    if bad.any():
        i = np.unravel_index(np.argmax(bad), bad.shape)
        return f"{int(bad.sum())}/{bad.size} differ, e.g. at {tuple(int(k) for k in i)}: {g[i]} vs {w[i]}"
    return None


def _check(outputs, expected, names, rtol, atol, rtols=None):
    errs = []
    for k, (name, got, want) in enumerate(zip(names, outputs, expected)):
        err = _mismatch(got, want, max(rtol, rtols[k]) if rtols else rtol, atol)
        if err:
            errs.append(f"{name}: {err}")
    return "; ".join(errs) if errs else None


def run_case(device, name, model, sets, rtol, atol):
    """(status, detail): status in passed / specialized / failed / unsupported."""
    why = _types_unsupported(model, sets)
    if why:
        return "unsupported", why
    inputs = sets[0][0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = MeganeuraBackend.prepare(model, device, inputs)
    except NotImplementedError as exc:
        return "unsupported", str(exc).split("; supported ops")[0][:200]
    except Exception as exc:  # noqa: BLE001  (an import or compile error of a supported op)
        return "failed", f"prepare: {type(exc).__name__}: {str(exc)[:300]}"
    names = list(rep.graph.outputs)
    rtols = [ULP_RTOL.get(vi.type.tensor_type.elem_type, 0.0) for vi in model.graph.output]
    errs = []
    for ins, want in sets:
        ins = [a for a, vi in zip(ins, model.graph.input) if vi.name not in rep.baked]
        try:
            got = rep.run(ins)
        except Exception as exc:  # noqa: BLE001
            errs.append(f"run: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        err = _check(got, want, names, rtol, atol, rtols)
        if err:  # is it the importer (float64 interpreter agrees with the GPU) or the GPU?
            with np.errstate(all="ignore"):
                ref = run_graph(rep.graph, dict(zip(rep.graph.inputs, ins)), np.float64)[0]
            ierr = _check([ref[k] for k in names], want, names, rtol, atol)
            errs.append(f"GPU: {err} | interpreter: {ierr or 'matches'}")
    if errs:
        return "failed", " / ".join(errs)
    return ("specialized" if rep.baked else "passed"), ", ".join(rep.baked)


def test_onnx_backend_node_suite(device):
    t0 = time.perf_counter()
    cases = _cases()
    t_collect = time.perf_counter() - t0
    results = {}
    only = re.compile(os.environ.get("MEGANEURA_ONNX_ONLY", ""))  # a regex of names, for debugging
    for name, model, sets, rtol, atol in cases:
        if not only.search(name):
            continue
        results[name] = run_case(device, name, model, sets, min(rtol, 1e-3), min(atol, 1e-7))
    elapsed = time.perf_counter() - t0
    counts = collections.Counter(s for s, _ in results.values())
    failed = {k: d for k, (s, d) in results.items() if s == "failed"}
    unexpected = {k: d for k, d in failed.items() if k not in ALLOWED}
    passed = counts["passed"] + counts["specialized"]
    attempted = passed + counts["failed"]
    print(f"\nONNX node tests: {len(results)}: {passed} passed ({counts['specialized']} specialized) "
          f"of {attempted} attempted, {counts['failed']} failed ({len(failed) - len(unexpected)} allowed), "
          f"{counts['unsupported']} not supported; {elapsed:.1f} s ({t_collect:.1f} s collecting)")
    for k, d in sorted(failed.items()):
        print(f"  FAILED{' (allowed)' if k in ALLOWED else ''} {k}: {d}")
    if os.environ.get("MEGANEURA_ONNX_REPORT"):  # a file of every result, for docs/ONNX.md
        with open(os.environ["MEGANEURA_ONNX_REPORT"], "w") as fh:
            for k, (s, d) in sorted(results.items()):
                fh.write(f"{k}\t{s}\t{d}\n")
    stale = sorted(k for k in ALLOWED if results.get(k, ("failed",))[0] != "failed")
    assert not unexpected, f"{len(unexpected)} ONNX node tests failed: {sorted(unexpected)}"
    assert not stale, f"allow-listed ONNX node tests that no longer fail (remove them): {stale}"
    if not os.environ.get("MEGANEURA_ONNX_ONLY"):  # docs/ONNX.md's tables match the importer and this run
        write = os.environ.get("MEGANEURA_ONNX_DOC") == "write"
        doc = onnx_doc.check(cases, results, ALLOWED, write)
        assert write or not doc, (f"docs/ONNX.md's generated sections are stale: {doc}; remake them with "
                                  "MEGANEURA_ONNX_DOC=write pytest tests/compiler/test_onnx_backend.py")

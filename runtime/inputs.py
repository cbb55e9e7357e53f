"""A Session's inputs and written weights, checked before they reach the GPU: names, shapes,
dtypes, finite values, labels, the rows of a batch. Errors speak of what the caller passed
(their array's shape, their input's name), never of the padded batch the GPU sees."""
from __future__ import annotations

import numpy as np

from .errors import InputError
from .format import F16_MAX
from .formats import INTS, NARROW, to_source


def fits(t, v):
    """`t` (a records.TensorInfo) can hold `v`: refuse values an f16 tensor cannot hold (beyond 65504 they would become infinite)."""
    if t.dtype == "f16" and v.dtype != np.float16 and np.abs(v).max(initial=0.0) > F16_MAX:
        raise ValueError(f"{t.role} {t.name!r} is stored in half precision (compiled with f16 weights) and "
                         f"cannot hold values beyond {F16_MAX:g}")


def rows(inputs):
    firsts = {np.shape(v)[0] for v in inputs.values() if np.ndim(v) > 0}
    return firsts.pop() if len(firsts) == 1 else None


def pad(v, start, b):
    v = np.asarray(v)
    part = v[start:start + b]
    if part.shape[0] == b:
        return part
    zeros = np.zeros((b - part.shape[0],) + part.shape[1:], dtype=part.dtype)
    return np.concatenate([part, zeros])


def _shape_text(shape, batched: bool) -> str:
    return "[" + ", ".join(["N", *map(str, shape[1:])] if batched else map(str, shape)) + "]"


def check_batch(program, inputs: dict, batch: int | None, training, check_finite: bool = True) -> dict:
    """The caller's `inputs` for `program` (a records.Program) as arrays the GPU can take,
    checked as given, before any padding or split; raises InputError in the caller's terms.

    `batch`: the compiled batch (inputs then take any number of rows in its place, at most
    `batch` for a training step); `training`: the package's records.Training, for labels."""
    public = program.public_inputs
    unknown = sorted(set(inputs) - set(public))
    if unknown:
        raise InputError(f"{program.name}: unknown inputs {unknown} (no input named {unknown[0]!r}); "
                         f"it takes {sorted(public)}")
    missing = sorted(set(public) - set(inputs))
    if missing:
        raise InputError(f"{program.name}: missing inputs {missing}; it takes {sorted(public)}")
    arrays = {name: _array(name, inputs[name], program.inputs[name]) for name in public}
    batched = batch is not None and all(program.inputs[n].shape[:1] == (batch,) for n in public)
    for name in public:
        t, arr = program.inputs[name], arrays[name]
        ok = arr.shape[1:] == t.shape[1:] and arr.ndim == len(t.shape) if batched else arr.shape == t.shape
        if not ok:
            raise InputError(f"input {name!r} has shape {list(arr.shape)}; {program.name} takes "
                             f"{_shape_text(t.shape, batched)}" + (f" (N rows)" if batched else ""))
    if batched:
        _check_rows(program, arrays, batch)
    for name in public:
        arrays[name] = _values(name, arrays[name], program.inputs[name], check_finite)
    labels = arrays.get("labels")
    if labels is not None and training is not None and training.loss == "cross_entropy" and program.name != "infer":
        _check_labels(labels, training)
    return arrays


def _array(name, value, t):
    arr = np.asarray(value)
    if arr.dtype.name == "bfloat16" or arr.dtype.name in NARROW:  # (ml_dtypes' types, numpy has none)
        arr = arr.astype(np.int32 if arr.dtype.name in INTS else np.float32)
    if arr.dtype.kind not in "fiub":
        raise InputError(f"input {name!r} holds {arr.dtype} values; it takes "
                         f"{'integers' if t.dtype == 'i32' else 'real numbers'}")
    return arr


def _check_rows(program, arrays, batch):
    names = list(arrays)
    first = names[0]
    n = arrays[first].shape[0]
    for name in names[1:]:
        if arrays[name].shape[0] != n:
            raise InputError(f"input {name!r} has {arrays[name].shape[0]} rows but {first!r} has {n}: "
                             "every input of a batch has the same number of rows")
    if n == 0:
        raise InputError(f"{program.name}: an empty batch (0 rows); pass at least one row")
    if n > batch and program.name != "infer":
        raise InputError(f"{program.name} was compiled for batches of {batch} rows at most; got {n} "
                         "(split the batch, or compile with a larger batch)")


def _values(name, arr, t, check_finite):
    """`arr` converted to the tensor's dtype, by the rules: integers for an i32 input (whole
    floats convert, others are refused), f32 for a float one, NaN refused unless asked."""
    if t.dtype == "i32":
        if t.source == "bool":  # the GPU holds a bool as 0 / 1: any nonzero number is true
            return (arr != 0).astype(np.int32)
        if arr.dtype.kind == "f":
            if not np.isfinite(arr).all() or not np.array_equal(arr, np.round(arr)):
                bad = np.argwhere(~np.isfinite(arr) | (arr != np.round(arr)))[0]
                raise InputError(f"input {name!r} takes integers; it holds {arr[tuple(bad)]} at index "
                                 f"{tuple(int(i) for i in bad)} (floats convert only when they are whole)")
        if arr.size and (arr.min() < -(2 ** 31) or arr.max() >= 2 ** 31):
            bad = np.argwhere((arr < -(2 ** 31)) | (arr >= 2 ** 31))[0]
            raise InputError(f"input {name!r}{_source_text(t)} holds {arr[tuple(bad)]} at index "
                             f"{tuple(int(i) for i in bad)}, outside the 32-bit integer range the model "
                             "computes in")
        lo, hi = INTS.get(t.source, (0, 0))
        if t.source in INTS and arr.size and (arr.min() < lo or arr.max() > hi):
            raise InputError(f"input {name!r} is {t.source} in the source model: it takes integers in [{lo}, {hi}]")
        return arr.astype(np.int32)
    out = arr.astype(np.float32)
    if t.source in NARROW:  # rounded to the source model's type, as its Cast would
        out = to_source(out, t.source)
    if check_finite and not np.isfinite(out).all():
        bad = np.argwhere(~np.isfinite(out))[0]
        raise InputError(f"input {name!r} holds NaN or infinity (first at index {tuple(int(i) for i in bad)}, "
                         f"{out[tuple(bad)]}); pass check_finite=False to allow it")
    return out


def _source_text(t) -> str:
    return f" ({t.source} in the source model)" if t.source else ""


# the narrow integer types an output wraps into, as the source model's arithmetic does
_WRAP = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16}


def as_source(t, arr: np.ndarray) -> np.ndarray:
    """An output as read from the GPU, in its source model's terms (`t`, a records.TensorInfo):
    float16 as float16, bfloat16 rounded to it (as float32: numpy has no bfloat16), bool as
    bool, 8- and 16-bit integers wrapped into their range (as int32); others as they are."""
    if t.source == "float16":
        return arr.astype(np.float16)
    if t.source == "bfloat16":
        bits = arr.view(np.uint32)
        rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)).view(np.float32)
        return np.where(np.isnan(arr), arr, rounded)
    if t.source == "bool":
        return arr != 0
    if t.source in _WRAP:
        return arr.astype(_WRAP[t.source]).astype(np.int32)
    if t.source in NARROW:  # float8, float4 and e8m0 as float32, 4- and 2-bit integers as int32
        return to_source(arr, t.source)
    return arr


def _check_labels(labels, training):
    """Class ids in [0, classes), or the package's ignore index (PyTorch's -100 by default)."""
    if training.classes is None:
        return
    outside = (labels < 0) | (labels >= training.classes)
    if training.ignore_index is not None:
        outside &= labels != training.ignore_index
    if outside.any():
        at = int(np.argwhere(outside.reshape(-1))[0][0])
        ignore = "" if training.ignore_index is None else f" and is not the ignore index {training.ignore_index}"
        raise InputError(f"label {int(labels.reshape(-1)[at])} at position {at} is outside the classes "
                         f"[0, {training.classes}){ignore}; nothing ran, the weights are unchanged")


def coerce(name, value, t, check_finite=True):
    """`value` as input `name` (tensor `t`, a records.TensorInfo) takes it, checked."""
    arr = _array(name, value, t)
    if arr.shape != t.shape:
        raise InputError(f"input {name!r} has shape {list(arr.shape)}; the model expects {list(t.shape)}")
    return _values(name, arr, t, check_finite)

"""Op conformance cases, part 2: neural-network layers (compiler/ir/ops_nn.py,
compiler/ir/ops_layers.py) and forward-only ops, added to op_cases.CASES / FWD_CASES."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from op_cases import (
    FWD_CASES,
    FwdCase,
    _rng,
    _sh,
    _unary,
    add_case,
    f32,
    normal,
    uniform,
    with_values,
)


# --- neural-network layers (compiler/ir/ops_nn.py, compiler/ir/ops_layers.py)
def _conv_t(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    top, left, bottom, right = padding
    return F.conv2d(F.pad(x, (left, right, top, bottom)), w, stride=stride, dilation=dilation, groups=groups)


def _convT_t(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, output_padding=(0, 0)):
    """Transposed convolution with ONNX-style (top, left, bottom, right) padding: the full
    output, extended by output_padding, then cropped."""
    top, left, bottom, right = padding
    full = F.conv_transpose2d(x, w, stride=stride, dilation=dilation, groups=groups)
    full = F.pad(full, (0, output_padding[1], 0, output_padding[0]))
    return full[:, :, top:full.shape[2] - bottom, left:full.shape[3] - right]


_CONV = [  # x shape, w shape, attrs
    ((2, 3, 11, 9), (5, 3, 3, 3), {"padding": (1, 1, 1, 1)}),
    ((2, 3, 11, 9), (4, 3, 3, 2), {"stride": (2, 3), "padding": (1, 0, 2, 1), "dilation": (2, 1)}),
    ((1, 6, 9, 7), (9, 2, 3, 3), {"stride": (2, 2), "padding": (0, 1, 1, 0), "groups": 3}),
    ((2, 5, 13, 17), (70, 5, 1, 1), {}),  # a 1x1 conv (a matmul, with its input gradient): past one 64x64 tile
]
for _xs, _ws, _at in _CONV:
    _id = f"conv2d-{_sh(_xs)}-{_sh(_ws)}-" + "-".join(f"{k}{''.join(map(str, v)) if isinstance(v, tuple) else v}"
                                                   for k, v in sorted(_at.items()))
    _r = _rng(_id)
    add_case(_id.rstrip("-"), "conv2d", {"a": normal(_r, _xs), "b": normal(_r, _ws, 0.5)},
             lambda b, t, _at=_at: b.op("conv2d", t["a"], t["b"], **_at),
             lambda t, _at=_at: _conv_t(t["a"], t["b"], **_at))

_CONVT = [
    ((2, 4, 5, 6), (4, 3, 3, 3), {"stride": (2, 2), "padding": (1, 1, 1, 1), "output_padding": (1, 0)}),
    ((1, 6, 4, 5), (6, 2, 3, 2), {"stride": (1, 2), "padding": (0, 1, 2, 0), "groups": 3, "dilation": (2, 1)}),
    ((2, 7, 5, 6), (7, 66, 1, 1), {}),  # pointwise: a matmul (CompileOptions.pointwise_conv_as_matmul)
    # strided: one GEMM per output phase (codegen_nn._transposed_by_phase); phases without taps are zeros
    ((2, 3, 4, 5), (3, 70, 1, 1), {"stride": (2, 2)}),
    ((1, 4, 3, 4), (4, 3, 2, 2), {"stride": (3, 3), "padding": (0, 1, 1, 0)}),
    ((2, 4, 6, 5), (4, 6, 3, 3), {"stride": (2, 2), "padding": (1, 1, 1, 1), "groups": 2}),
]
for _xs, _ws, _at in _CONVT:
    _id = f"conv_transpose2d-{_sh(_xs)}-{_sh(_ws)}"
    _r = _rng(_id)
    add_case(_id, "conv_transpose2d", {"a": normal(_r, _xs), "b": normal(_r, _ws, 0.5)},
             lambda b, t, _at=_at: b.op("conv_transpose2d", t["a"], t["b"], **_at),
             lambda t, _at=_at: _convT_t(t["a"], t["b"], **_at))

_POOL = [  # x shape, attrs (symmetric padding, as torch takes it)
    ((2, 3, 7, 9), {"kernel": (2, 2)}),
    ((2, 3, 11, 8), {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1, 1, 1), "ceil_mode": True}),
    ((1, 2, 9, 10), {"kernel": (3, 2), "stride": (2, 1), "padding": (1, 0, 1, 0)}),
]


def _pool_t(fn, x, kernel, stride=None, padding=(0, 0, 0, 0), ceil_mode=False, **kw):
    return fn(x, kernel, stride or kernel, (padding[0], padding[1]), ceil_mode=ceil_mode, **kw)


for _xs, _at in _POOL:
    _id = f"max_pool2d-{_sh(_xs)}-k{''.join(map(str, _at['kernel']))}-{len(_at)}"
    add_case(_id, "max_pool2d", {"a": normal(_rng(_id), _xs)},  # continuous values: no ties in a window
             lambda b, t, _at=_at: b.op("max_pool2d", t["a"], **_at),
             lambda t, _at=_at: _pool_t(F.max_pool2d, t["a"], **_at))
    for _cip in (True, False):
        _id = f"avg_pool2d-{_sh(_xs)}-k{''.join(map(str, _at['kernel']))}-{len(_at)}-{'incl' if _cip else 'excl'}"
        add_case(_id, "avg_pool2d", {"a": normal(_rng(_id), _xs)},
                 lambda b, t, _at=_at, _cip=_cip: b.op("avg_pool2d", t["a"], **_at, count_include_pad=_cip),
                 lambda t, _at=_at, _cip=_cip: _pool_t(F.avg_pool2d, t["a"], **_at, count_include_pad=_cip))


def _index(starts, steps, shape):
    """torch advanced indices (np.ix_ style) for x[start + c * step] along every axis."""
    rank = len(shape)
    out = []
    for a, (s0, st, n) in enumerate(zip(starts, steps, shape)):
        view = [1] * rank
        view[a] = n
        out.append((torch.arange(n) * st + s0).reshape(view))
    return tuple(out)


_SLICES = [((7, 13), (1, 2), (2, 3), (3, 4)), ((3, 5, 17), (0, 4, 16), (1, -1, -2), (3, 5, 9)),
           ((3, 5, 17), (2, 1, 3), (1, 1, 1), (1, 3, 11))]
for _s, _st, _sp, _out in _SLICES:
    _id = f"slice-{_sh(_s)}-{_sh(_out)}-{'_'.join(map(str, _sp))}"
    add_case(_id, "slice", {"a": normal(_rng(_id), _s)},
             lambda b, t, _st=_st, _sp=_sp, _out=_out: b.op("slice", t["a"], starts=_st, steps=_sp, shape=_out),
             lambda t, _st=_st, _sp=_sp, _out=_out: t["a"][_index(_st, _sp, _out)])
for _s, _st, _sp, _out, _v in (((3, 4), (1, 2), (2, 3), (7, 13), 0.0),
                               ((3, 5, 9), (0, 4, 16), (1, -1, -2), (3, 5, 17), 1.5),
                               ((1, 3, 11), (2, 1, 3), (1, 1, 1), (3, 5, 17), -2.0)):
    _id = f"pad-{_sh(_s)}-{_sh(_out)}-v{_v:g}"

    def _pad_t(t, _st=_st, _sp=_sp, _out=_out, _v=_v):
        full = torch.full(_out, _v, dtype=torch.float64)
        return full.index_put(_index(_st, _sp, t["a"].shape), t["a"])

    add_case(_id, "pad", {"a": normal(_rng(_id), _s)},
             lambda b, t, _st=_st, _sp=_sp, _out=_out, _v=_v: b.op("pad", t["a"], starts=_st, steps=_sp, shape=_out,
                                                                   value=_v), _pad_t)

for _sc, _sa, _sb in (((7, 13), (7, 13), ()), ((5, 1), (1, 6), (5, 6)), ((4, 6), (6,), (4, 1))):
    _id = f"where-{_sh(_sc)}-{_sh(_sa)}-{_sh(_sb)}"
    _r = _rng(_id)
    _cond = with_values(_r.random(_sc) < 0.5, [1.0, 0.0])  # both branches taken
    add_case(_id, "where", {"cond": _cond, "a": normal(_r, _sa), "b": normal(_r, _sb)},
             lambda b, t: b.where(t["cond"], t["a"], t["b"]), lambda t: torch.where(t["cond"] != 0, t["a"], t["b"]),
             wrt=("a", "b"))

for _shapes, _ax in ((((3, 4), (3, 7), (3, 1)), 1), (((2, 3, 5), (1, 3, 5)), 0), (((2, 3, 5), (2, 3, 5)), -2)):
    _id = f"concat-{'-'.join(_sh(s) for s in _shapes)}-ax{_ax}"
    _r = _rng(_id)
    _names = ["a", "b", "c"][:len(_shapes)]
    add_case(_id, "concat", {k: normal(_r, s) for k, s in zip(_names, _shapes)},
             lambda b, t, _names=_names, _ax=_ax: b.concat(*[t[k] for k in _names], axis=_ax),
             lambda t, _names=_names, _ax=_ax: torch.cat([t[k] for k in _names], _ax))

for _rows, _inner, _idx in ((10, (7,), [[0, 3, 3, 9], [-1, 2, 0, 3], [5, 5, 5, 1]]), (70, (3, 5), [1, 69, -70, 1, 8])):
    _id = f"gather-{_rows}x{_sh(_inner)}-{_sh(np.shape(_idx))}"
    add_case(_id, "gather", {"a": normal(_rng(_id), (_rows,) + _inner), "idx": np.array(_idx, np.int32)},
             lambda b, t: b.gather(t["a"], t["idx"]), lambda t: t["a"][t["idx"]], wrt=("a",))

_unary("silu", "silu", lambda r, s: with_values(normal(r, s, 3.0), [30, -30, 1e-4, 0.0]),
       lambda b, t: b.silu(t["a"]), lambda t: F.silu(t["a"]))
_unary("softplus", "softplus", lambda r, s: with_values(normal(r, s, 5.0), [30, 20.5, 19.5, -30, 1e-4, 0.0]),
       lambda b, t: b.softplus(t["a"]), lambda t: F.softplus(t["a"]))
for _sa, _sb in (((7, 13), (7, 13)), ((5, 1), (1, 6))):
    _id = f"swiglu-{_sh(_sa)}-{_sh(_sb)}"
    _r = _rng(_id)
    add_case(_id, "swiglu", {"a": normal(_r, _sa, 2.0), "b": normal(_r, _sb)},
             lambda b, t: b.swiglu(t["a"], t["b"]), lambda t: F.silu(t["a"]) * t["b"])

for _s, _k, _affine in (((4, 7, 13), 1, True), ((3, 5, 70), 2, True), ((6, 37), 1, False)):
    _id = f"layer_norm-{_sh(_s)}-n{_k}-{'affine' if _affine else 'plain'}"
    _r = _rng(_id)
    _ins = {"a": normal(_r, _s, 2.0) + 0.5}
    if _affine:
        _ins.update(w=normal(_r, _s[-_k:]), b=normal(_r, _s[-_k:]))
    add_case(_id, "layer_norm", _ins,
             lambda b, t, _k=_k: b.layer_norm(*[t[k] for k in ("a", "w", "b") if k in t], normalized_ndim=_k,
                                              eps=1e-5),
             lambda t, _k=_k: F.layer_norm(t["a"], t["a"].shape[-_k:], t.get("w"), t.get("b"), eps=1e-5))
for _s, _k, _affine in (((4, 7, 13), 1, True), ((3, 70), 1, False), ((2, 3, 5, 6), 2, True)):
    _id = f"rms_norm-{_sh(_s)}-n{_k}-{'affine' if _affine else 'plain'}"
    _r = _rng(_id)
    _ins = {"a": normal(_r, _s, 2.0)}
    if _affine:
        _ins["w"] = normal(_r, _s[-_k:])
    add_case(_id, "rms_norm", _ins,
             lambda b, t, _k=_k: b.rms_norm(*[t[k] for k in ("a", "w") if k in t], normalized_ndim=_k, eps=1e-6),
             lambda t, _k=_k: F.rms_norm(t["a"], t["a"].shape[-_k:], t.get("w"), eps=1e-6))
for _s, _g, _affine in (((2, 6, 5, 7), 3, True), ((3, 4, 11), 2, False), ((2, 6, 5, 7), 6, True)):
    _id = f"group_norm-{_sh(_s)}-g{_g}-{'affine' if _affine else 'plain'}"
    _r = _rng(_id)
    _ins = {"a": normal(_r, _s, 2.0) - 0.5}
    if _affine:
        _ins.update(w=normal(_r, _s[1:2]), b=normal(_r, _s[1:2]))
    add_case(_id, "group_norm", _ins,
             lambda b, t, _g=_g: b.group_norm(*[t[k] for k in ("a", "w", "b") if k in t], groups=_g, eps=1e-5),
             lambda t, _g=_g: F.group_norm(t["a"], _g, t.get("w"), t.get("b"), eps=1e-5))
def _batch_norm_t(t, training):
    if training:  # batch statistics (torch updates copies of the running ones)
        return F.batch_norm(t["a"], t["rm"].detach().clone(), t["rv"].detach().clone(), t["w"], t["b"],
                            training=True, eps=1e-5)
    shape = (1, -1) + (1,) * (t["a"].dim() - 2)
    return ((t["a"] - t["rm"].reshape(shape)) / torch.sqrt(t["rv"].reshape(shape) + 1e-5) * t["w"].reshape(shape)
            + t["b"].reshape(shape))


for _s, _train in (((4, 6, 5, 7), True), ((4, 6, 5, 7), False), ((9, 5), True)):
    _id = f"batch_norm-{_sh(_s)}-{'train' if _train else 'eval'}"
    _r = _rng(_id)
    _c = _s[1]
    add_case(_id, "batch_norm", {"a": normal(_r, _s, 2.0) + 1.0, "w": normal(_r, (_c,)), "b": normal(_r, (_c,)),
                                 "rm": normal(_r, (_c,)), "rv": uniform(_r, 0.5, 2.0, (_c,))},
             lambda b, t, _train=_train: b.batch_norm(t["a"], t["w"], t["b"], t["rm"], t["rv"], training=_train,
                                                      eps=1e-5),
             lambda t, _train=_train: _batch_norm_t(t, _train),
             wrt=("a", "w", "b") if _train else ("a", "w", "b", "rm", "rv"))


def _attention_torch(t, causal=False, scale=None):
    q, k, v = t["a"], t["b"], t["v"]
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:  # query i sees keys up to i + (t - s): aligned at the bottom right
        sq, tk = q.shape[2], k.shape[2]
        allowed = torch.arange(tk)[None, :] <= torch.arange(sq)[:, None] + (tk - sq)
        s = s.masked_fill(~allowed, -math.inf)
    if "mask" in t:
        s = s + t["mask"]
    return torch.softmax(s, -1) @ v


_ATTN = [  # q, k, v shapes, mask shape or None, attrs
    ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 6), None, {}),
    ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 6), None, {"causal": True}),  # grouped-query heads
    ((1, 6, 9, 4), (1, 3, 9, 4), (1, 3, 9, 5), (1, 1, 9, 9), {"scale": 0.3}),
    ((2, 2, 3, 5), (2, 1, 6, 5), (2, 1, 6, 3), (2, 2, 3, 6), {"causal": True}),
]
for _q, _k, _v, _m, _at in _ATTN:
    _id = f"attention-{_sh(_q)}-{_sh(_k)}-{_sh(_v)}" + (f"-mask{_sh(_m)}" if _m else "") + "".join(
        f"-{k}" for k in sorted(_at))
    _r = _rng(_id)
    _ins = {"a": normal(_r, _q), "b": normal(_r, _k), "v": normal(_r, _v)}
    if _m:
        _ins["mask"] = normal(_r, _m)
    add_case(_id, "attention", _ins,
             lambda b, t, _at=_at: b.attention(*[t[k] for k in ("a", "b", "v", "mask") if k in t], **_at),
             lambda t, _at=_at: _attention_torch(t, **_at), wrt=("a", "b", "v"))


def _scores_t(t, causal=False, scale=None):
    q, k = t["a"], t["b"]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:
        sq, tk = q.shape[2], k.shape[2]
        s = s.masked_fill(~(torch.arange(tk)[None, :] <= torch.arange(sq)[:, None] + (tk - sq)), -math.inf)
    return s


def _attention_grad_t(t, wrt, **at):
    """attention's gradient w.r.t. q, k or v (create_graph: the case differentiates it again)."""
    x = [t["a"], t["b"], t["v"]]
    if not x[wrt].requires_grad:  # v, when the case does not differentiate dV by it (no part in it)
        x[wrt] = x[wrt].detach().requires_grad_()
    o = _attention_torch(dict(zip("abv", x)), **at)
    return torch.autograd.grad(o, x[wrt], t["do"], create_graph=True)[0]


# the fused backward's rows: the forward's log-sum-exp, and the gradient itself (its own
# gradient, second order, differentiates attention's decomposition); o and lse are inputs
# that the kernel trusts, so they are made from q, k, v here
for _q, _k, _v, _at in (((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), {"causal": True}),
                        ((1, 3, 9, 4), (1, 3, 9, 4), (1, 3, 9, 4), {"scale": 0.3})):
    _id = f"attention_lse-{_sh(_q)}-{_sh(_k)}" + "".join(f"-{k}" for k in sorted(_at))
    _r = _rng(_id)
    add_case(_id, "attention_lse", {"a": normal(_r, _q), "b": normal(_r, _k), "v": normal(_r, _v)},
             lambda b, t, _at=_at: b.op("attention_lse", t["a"], t["b"], t["v"], **_at),
             lambda t, _at=_at: torch.logsumexp(_scores_t(t, **_at), -1), wrt=("a", "b"))
for _w, (_q, _k, _v, _at) in enumerate((((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), {"causal": True}),
                                        ((1, 2, 6, 4), (1, 1, 6, 4), (1, 1, 6, 4), {"scale": 0.3}),
                                        ((2, 2, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8), {"causal": True}))):
    _id = f"attention_grad-wrt{_w}-{_sh(_q)}-{_sh(_k)}" + "".join(f"-{k}" for k in sorted(_at))
    _r = _rng(_id)
    _ins = {"a": normal(_r, _q), "b": normal(_r, _k), "v": normal(_r, _v), "do": normal(_r, _q)}
    _tt = {k: torch.tensor(x) for k, x in _ins.items()}
    _ins["o"] = f32(_attention_torch(_tt, **_at).numpy())
    _ins["lse"] = f32(torch.logsumexp(_scores_t(_tt, **_at), -1).numpy())
    add_case(_id, "attention_grad", _ins,
             lambda b, t, _w=_w, _at=_at: b.op("attention_grad", *[t[k] for k in ("a", "b", "v", "o", "do", "lse")],
                                               wrt=_w, **_at),
             lambda t, _w=_w, _at=_at: _attention_grad_t(t, _w, **_at),
             wrt=("a", "b", "do") if _w == 2 else ("a", "b", "v", "do"))  # dV = P^T dO: v plays no part


def _rope_t(t):
    x = t["a"]
    h = x.shape[-1] // 2
    return x * t["b"] + torch.cat([-x[..., h:], x[..., :h]], -1) * t["c"]


for _xs, _cs in (((2, 3, 5, 8), (5, 8)), ((1, 2, 7, 6), (1, 1, 7, 6))):
    _id = f"rope-{_sh(_xs)}-{_sh(_cs)}"
    _r = _rng(_id)
    _ang = _r.uniform(0, 6.3, _cs)
    add_case(_id, "rope", {"a": normal(_r, _xs), "b": f32(np.cos(_ang)), "c": f32(np.sin(_ang))},
             lambda b, t: b.rope(t["a"], t["b"], t["c"]), _rope_t)

_RESIZE = [  # x shape, output size, our attrs, torch interpolate kwargs
    ((2, 3, 5, 7), (9, 4), {"mode": "linear", "transform": "pytorch_half_pixel"},
     {"mode": "bilinear", "align_corners": False}),
    ((1, 2, 5, 7), (9, 13), {"mode": "linear", "transform": "align_corners"},
     {"mode": "bilinear", "align_corners": True}),
    ((2, 2, 5, 7), (8, 11), {"mode": "cubic", "transform": "half_pixel", "cubic_a": -0.75},
     {"mode": "bicubic", "align_corners": False}),
    ((2, 3, 5, 7), (9, 4), {"mode": "nearest", "transform": "asymmetric", "nearest_mode": "floor"},
     {"mode": "nearest"}),
]
for _xs, _size, _at, _tk in _RESIZE:
    _id = f"resize-{_at['mode']}-{_at['transform']}-{_sh(_xs)}-{_sh(_size)}"
    add_case(_id, "resize", {"a": normal(_rng(_id), _xs)},
             lambda b, t, _size=_size, _at=_at: b.resize(t["a"], size=_size, **_at),
             lambda t, _size=_size, _tk=_tk: F.interpolate(t["a"], size=_size, **_tk))


# --- forward-only ops
def _fwd(id, op, inputs, build, reference, exact=True):
    FWD_CASES.append(FwdCase(id, op, inputs, build, reference, exact))


_r = _rng("eq")
_x = normal(_r, (5, 6))
_y = np.where(_r.random((5, 6)) < 0.4, _x, normal(_r, (5, 6)))
_fwd("eq-5x6-5x6", "eq", {"a": _x, "b": _y}, lambda b, t: b.eq(t["a"], t["b"]),
     lambda v: (v["a"] == v["b"]).astype(np.float32))
_x = f32(_r.integers(-2, 3, (5, 1)))
_y = f32(_r.integers(-2, 3, (1, 6)))
_fwd("eq-5x1-1x6", "eq", {"a": _x, "b": _y}, lambda b, t: b.eq(t["a"], t["b"]),
     lambda v: (v["a"] == v["b"]).astype(np.float32))
_fwd("eq-i32-7-scalar", "eq", {"a": _r.integers(0, 4, (7,)).astype(np.int32), "b": np.array(2, np.int32)},
     lambda b, t: b.eq(t["a"], t["b"]), lambda v: (v["a"] == v["b"]).astype(np.float32))
_fwd("step-3x5x17", "step", {"a": with_values(normal(_rng("step"), (3, 5, 17)), [0.0, -0.0, 1e-30, -1e-30])},
     lambda b, t: b.step(t["a"]), lambda v: (v["a"] > 0).astype(np.float32))
_fwd("nonfinite-4x9", "nonfinite",
     {"a": with_values(normal(_rng("nonfinite"), (4, 9), 1e30), [np.nan, np.inf, -np.inf, 1.7e38, -0.0, 1e-45])},
     lambda b, t: b.nonfinite(t["a"] * 2.0), lambda v: (~np.isfinite(v["a"] * 2.0)).astype(np.float32))
_fwd("cast-f32-i32-7x13", "cast", {"a": with_values(normal(_rng("cast"), (7, 13), 5.0), [2.7, -2.7, 0.5, -0.5])},
     lambda b, t: b.cast(t["a"], to="i32"), lambda v: np.trunc(v["a"]).astype(np.int32))
_fwd("cast-i32-f32-7x13", "cast", {"a": _rng("cast2").integers(-1000, 1000, (7, 13)).astype(np.int32)},
     lambda b, t: b.cast(t["a"], to="f32") * 0.5, lambda v: v["a"].astype(np.float64) * 0.5)
_fwd("one_hot-9x1-d7", "one_hot", {"a": np.array([[0], [6], [3], [3], [1], [7], [-1], [5], [2]], np.int32)},
     lambda b, t: b.one_hot(t["a"], depth=7), lambda v: (v["a"] == np.arange(7)).astype(np.float32))
_fwd("one_hot-2x3x1-d5", "one_hot", {"a": _rng("oh").integers(0, 5, (2, 3, 1)).astype(np.int32)},
     lambda b, t: b.one_hot(t["a"], depth=5), lambda v: (v["a"] == np.arange(5)).astype(np.float32))


def _torch_vjp(fn, x, ct):
    """d/dx sum(fn(x) * ct), by torch autograd in float64."""
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad((fn(t) * torch.tensor(ct, dtype=torch.float64)).sum(), t)
    return g.numpy()


for _xs, _ws, _at in _CONV[:3]:
    _id = f"conv2d_weight_grad-{_sh(_xs)}-{_sh(_ws)}"
    _r = _rng(_id)
    _x = normal(_r, _xs)
    _w = normal(_r, _ws)
    _y = _conv_t(torch.tensor(_x), torch.tensor(_w), **_at)
    _gy = normal(_r, tuple(_y.shape))
    _fwd(_id, "conv2d_weight_grad", {"a": _x, "gy": _gy},
         lambda b, t, _at=_at, _ws=_ws: b.op("conv2d_weight_grad", t["a"], t["gy"], **_at, kernel=_ws[2:]),
         lambda v, _at=_at, _w=_w: _torch_vjp(lambda w: _conv_t(torch.tensor(v["a"]), w, **_at), _w, v["gy"]),
         exact=False)

for _xs, _at in _POOL:
    for _op, _fn, _extra in (("max_pool2d", F.max_pool2d, {}), ("avg_pool2d", F.avg_pool2d,
                                                                 {"count_include_pad": False})):
        _id = f"{_op}_grad-{_sh(_xs)}-k{''.join(map(str, _at['kernel']))}-{len(_at)}"
        _r = _rng(_id)
        _x = normal(_r, _xs)
        _y = _pool_t(_fn, torch.tensor(_x), **_at, **_extra)
        _fwd(_id, f"{_op}_grad", {"a": _x, "gy": normal(_r, tuple(_y.shape))},
             lambda b, t, _op=_op, _at=_at, _extra=_extra: b.op(f"{_op}_grad", t["a"], t["gy"], **_at, **_extra),
             lambda v, _fn=_fn, _at=_at, _extra=_extra: _torch_vjp(lambda x: _pool_t(_fn, x, **_at, **_extra),
                                                                   v["a"], v["gy"]),
             exact=False)

_fwd("scatter_add-4x3x5-rows9", "scatter_add",
     {"a": normal(_rng("scatter"), (4, 3, 5)),
      "idx": np.array([[0, 8, 0], [-1, 2, 0], [3, 3, 3], [7, 0, -9]], np.int32)},
     lambda b, t: b.scatter_add(t["a"], t["idx"], rows=9),
     lambda v: torch.zeros(9, 5, dtype=torch.float64).index_add_(
         0, torch.tensor(v["idx"].reshape(-1).astype(np.int64) % 9), torch.tensor(v["a"].reshape(-1, 5))).numpy(),
     exact=False)


def _scatter_ref(v, rows):
    """Sums rows of v["a"] into a [rows, columns] table by index (negative ones count from the
    end); indices outside the table are skipped."""
    a, idx = v["a"].reshape(-1, v["a"].shape[-1]), v["idx"].reshape(-1).astype(np.int64)
    out = np.zeros((rows, a.shape[1]))
    for i, row in enumerate(np.where(idx < 0, idx + rows, idx)):
        if 0 <= row < rows:
            out[row] += a[i]
    return out


_r = _rng("scatter-long")  # long runs of one row (the sum walks each row's indices in order), and strays
_idx = _r.integers(-5, 5, (3, 100)).astype(np.int32)
_idx[0, :3] = [5, -6, 40]  # outside a 5-row table: skipped
_fwd("scatter_add-3x100x7-rows5-strays", "scatter_add", {"a": normal(_r, (3, 100, 7)), "idx": _idx},
     lambda b, t: b.scatter_add(t["a"], t["idx"], rows=5), lambda v: _scatter_ref(v, 5), exact=False)
_id = "silu_grad-7x13"
_fwd(_id, "silu_grad", {"a": with_values(normal(_rng(_id), (7, 13), 3.0), [30, -30, 1e-4, 0.0])},
     lambda b, t: b.silu_grad(t["a"]),
     lambda v: _torch_vjp(F.silu, v["a"], np.ones_like(v["a"])), exact=False)


def _torch_gelu_grad(x, approximate):
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(F.gelu(t, approximate=approximate).sum(), t)
    return g.numpy()


for _ap in ("none", "tanh"):
    for _s in ((7, 13), (3, 5, 17)):
        _id = f"gelu_grad_{_ap}-{_sh(_s)}"
        _fwd(_id, "gelu_grad", {"a": with_values(normal(_rng(_id), _s, 3.0), [10, -10, 1e-4, -6.0, 0.0])},
             lambda b, t, _ap=_ap: b.gelu_grad(t["a"], approximate=_ap),
             lambda v, _ap=_ap: _torch_gelu_grad(v["a"], _ap), exact=False)

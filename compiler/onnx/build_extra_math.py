"""Graph builders for elementary functions (Sin ... Atanh, Round), Pow with a tensor exponent,
Mod of floats, Det, CumProd, BitCast, ConstantOfShape of a computed shape, SwiGLU, the
training ops of ai.onnx.preview.training (Momentum, Adam, Adagrad: elementwise updates) and
BatchNormalization in training mode (its other modes are build_nn.py's).

Each takes (importer, input names, attributes) and returns the output value(s)."""
from __future__ import annotations

import itertools

import numpy as np

from ..ir.builder import Tensor
from ..ir.ops_layers import batch_statistics
from .build_nn import BUILD_NN
from .common import BOOL_TYPE, Known
from .fold import FOLD

TRAINING = "ai.onnx.preview.training::"
UNARY = {"Sin": "sin", "Cos": "cos", "Tan": "tan", "Sinh": "sinh", "Cosh": "cosh", "Asin": "asin", "Acos": "acos",
         "Atan": "atan", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh"}
DET_MAX = 5  # Det expands over the n! permutations (120 products of 5 for a 5x5 matrix)


def _unary(kind):
    return lambda im, ins, at: im.b.op("unary", im.tensor(ins[0]), kind=kind)


def power(im, ins) -> Tensor:
    """x ** y for a tensor exponent y, broadcast. Integer x with integer y: exact i32 powers;
    integer x with float y: the float power truncated to an integer (as numpy's astype)."""
    b = im.b
    x, y = im.tensor(ins[0]), im.tensor(ins[1])
    if x.dtype == "i32" and y.dtype == "i32":
        return b.int_power(x, y)
    out = b.power(_as_float(b, x), _as_float(b, y))
    return b.op("cast", out, to="i32") if x.dtype == "i32" else out


def _as_float(b, t: Tensor) -> Tensor:
    return t if t.dtype == "f32" else b.op("cast", t, to="f32")


def float_mod(im, a: Tensor, c: Tensor, fmod: bool) -> Tensor:
    """The exact remainder of floats: C's fmod (fmod=1, the dividend's sign) or numpy's
    remainder (fmod=0, the divisor's sign)."""
    return im.b.op("float_mod", a, c, kind="trunc" if fmod else "floor")


# ---------------------------------------------------------------------- Det
def _b_det(im, ins, at):
    """The Leibniz sum over permutations p of sign(p) * prod_i x[i, p(i)]: gathers,
    products and one sum, exact in the number of roundings for the small matrices it takes."""
    b, x = im.b, im.tensor(ins[0])
    if x.dtype != "f32" or len(x.shape) < 2 or x.shape[-1] != x.shape[-2]:
        raise NotImplementedError(f"node {im.label!r}: Det of {x.dtype}{list(x.shape)} (square float matrices)")
    n, batch = x.shape[-1], x.shape[:-2]
    if n > DET_MAX:
        raise NotImplementedError(f"node {im.label!r}: Det of {n}x{n} matrices (at most {DET_MAX}x{DET_MAX})")
    perms = list(itertools.permutations(range(n)))
    idx = np.array([[i * n + p[i] for i in range(n)] for p in perms], np.int32)  # [P, n]
    sign = np.array([np.linalg.det(np.eye(n)[list(p)]) for p in perms]).round().reshape(-1, 1, 1)
    rows = int(np.prod(batch, dtype=np.int64))
    flat = b.transpose(b.reshape(x, (rows, n * n)), (1, 0))  # [n*n, B]
    picked = b.gather(flat, b.constant_ids(idx))  # [P, n, B]
    prod = None
    for i in range(n):
        f = b.slice(picked, starts=(0, i, 0), steps=(1, 1, 1), shape=(len(perms), 1, rows))
        prod = f if prod is None else prod * f
    det = b.sum(prod * b.constant(sign), 0)  # [1, B]
    return b.reshape(det, batch)


# ------------------------------------------------------------------ CumProd
def _shifted(b, x: Tensor, axis, s, reverse) -> Tensor:
    """x moved s places along `axis` (toward its end; `reverse`: toward its start), 1 filling
    the places left."""
    rank, n = len(x.shape), x.shape[axis]
    head = tuple(n - s if a == axis else d for a, d in enumerate(x.shape))
    at = tuple(s if a == axis else 0 for a in range(rank))
    kept = b.slice(x, starts=at if reverse else (0,) * rank, steps=(1,) * rank, shape=head)
    return b.pad(kept, starts=(0,) * rank if reverse else at, steps=(1,) * rank, shape=x.shape, value=1)


def running_product(b, x: Tensor, axis, exclusive=False, reverse=False) -> Tensor:
    """The running product along `axis` in log2(n) steps, each x * (x shifted by 1, 2, 4 ...)
    (Hillis and Steele's scan): exact for integers (wrapping as i32 does)."""
    n = x.shape[axis]
    if exclusive:
        x = _shifted(b, x, axis, 1, reverse) if n > 1 else b.op("broadcast_to", b.const(1, x.dtype), shape=x.shape)
    s = 1
    while s < n:
        x = x * _shifted(b, x, axis, s, reverse)
        s *= 2
    return x


def _b_cumprod(im, ins, at):
    x = im.tensor(ins[0])
    if 0 in x.shape or not x.shape:
        raise NotImplementedError(f"node {im.label!r}: CumProd of {list(x.shape)}")
    axis = int(np.asarray(im.known(ins[1], "axis")).reshape(-1)[0]) % len(x.shape)
    return running_product(im.b, x, axis, bool(at.get("exclusive", 0)), bool(at.get("reverse", 0)))


# ------------------------------------------------------------------ BitCast
_WIDTH = {1: 32, 6: 32, 12: 32, 3: 8, 2: 8, 9: 8, 5: 16, 4: 16, 7: 64, 13: 64}  # ONNX type -> bits
_SIGNED = {3: True, 2: False, 5: True, 4: False, 6: True, 12: False, 7: True, 13: False}


def _elem_type(im, name):
    """The ONNX element type of value `name`, where the model declares it."""
    g = im.proto.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.name == name and vi.type.HasField("tensor_type"):
            return vi.type.tensor_type.elem_type
    v = im.env.get(name)
    if isinstance(v, Known):
        from onnx import helper
        return helper.np_dtype_to_tensor_dtype(v.value.dtype)
    return None


def _b_bitcast(im, ins, at):
    """The same bits as another type of the same width: float32 <-> (u)int32 through WGSL's
    bitcast; integers of 8 and 16 bits change only how their top bit reads."""
    b, src, to = im.b, _elem_type(im, ins[0]), int(at["to"])
    if src is None or src not in _WIDTH or to not in _WIDTH or _WIDTH[src] != _WIDTH[to]:
        raise NotImplementedError(f"node {im.label!r}: BitCast from ONNX type {src} to {to}")
    if src == BOOL_TYPE:
        return b.op("cast", im.mask_of(ins[0]), to="i32")
    if to == BOOL_TYPE:
        raise NotImplementedError(f"node {im.label!r}: BitCast to bool")
    x = im.tensor(ins[0])
    if to == 1 or src == 1:
        return b.op("bitcast", x, to="f32" if to == 1 else "i32")
    bits = _WIDTH[to]
    if bits == 32 or bits == 64 or _SIGNED[src] == _SIGNED[to]:
        return x
    if _SIGNED[to]:  # the top bit of `bits` becomes the sign
        return b.bitwise(b.bitwise(x, 32 - bits, kind="shl"), 32 - bits, kind="shr")
    return b.bitwise(x, (1 << bits) - 1, kind="and")


# ------------------------------------------------------------ other builders
def _b_constant_of_shape(im, ins, at):
    """ConstantOfShape of a shape known only once a graph input is made a constant."""
    return FOLD["ConstantOfShape"](im, [np.asarray(im.known(ins[0], "the shape"))], at)


def _b_swiglu(im, ins, at):
    b, a, c = im.b, im.tensor(ins[0]), im.tensor(ins[1])
    alpha = float(at.get("alpha", 1.0))
    return b.swiglu(a, c) if alpha == 1.0 else a * b.sigmoid(a * alpha) * c


def _b_batch_norm(im, ins, at):
    """In training mode: normalised by the batch's mean and (biased) variance; the running
    statistics out are running * momentum + batch * (1 - momentum), as ONNX says."""
    if not (at.get("training_mode", 0) or any(im.node.output[1:])):
        return BUILD_NN["BatchNormalization"](im, ins, at)
    b = im.b
    x, scale, bias, mean, var = (im.tensor(n) for n in ins[:5])
    eps, momentum = float(at.get("epsilon", 1e-5)), float(at.get("momentum", 0.9))
    y = b.batch_norm(x, scale, bias, mean, var, eps=eps, training=True)
    _, count, m, _, squares = batch_statistics(b.e, x.id)
    c = x.shape[1]
    m = b.reshape(Tensor(b, m), (c,))
    v = b.reshape(Tensor(b, squares), (c,)) * (1.0 / max(count, 1))
    return [y, mean * momentum + m * (1.0 - momentum), var * momentum + v * (1.0 - momentum)]


# ---------------------------------------------------- ai.onnx.preview.training
def _groups(im, ins, k):
    """(R, T, k lists of the optimized tensors' inputs): X..., G..., then the states."""
    n = (len(ins) - 2) // k
    if n < 1 or len(ins) != 2 + k * n:
        raise ValueError(f"node {im.label!r}: {len(ins)} inputs do not make groups of {k}")
    return im.tensor(ins[0]), im.tensor(ins[1]), [[im.tensor(x) for x in ins[2 + j * n: 2 + (j + 1) * n]]
                                                  for j in range(k)]


def _later(b, t: Tensor) -> Tensor:
    """1 where the update count T is above 0 (a step after the first)."""
    return b.greater(t, b.const(0, t.dtype))


def _b_momentum(im, ins, at):
    b = im.b
    r, t, (xs, gs, vs) = _groups(im, ins, 3)
    norm, alpha, beta = float(at["norm_coefficient"]), float(at["alpha"]), float(at["beta"])
    beta_t = b.where(_later(b, t), beta, 1.0)
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        gr = x * norm + g
        v2 = v * alpha + gr * beta_t
        step = gr + v2 * alpha if at.get("mode", "standard") == "nesterov" else v2
        new_x.append(x - r * step)
        new_v.append(v2)
    return new_x + new_v


def _b_adam(im, ins, at):
    b = im.b
    r, t, (xs, gs, vs, hs) = _groups(im, ins, 4)
    alpha, beta = float(at.get("alpha", 0.9)), float(at.get("beta", 0.999))
    eps, norm = float(at.get("epsilon", 1e-6)), float(at.get("norm_coefficient", 0.0))
    post = float(at.get("norm_coefficient_post", 0.0))
    later, tf = _later(b, t), _as_float(b, t)
    # bias corrections after the first step: r * sqrt(1 - beta^T) / (1 - alpha^T)
    c2 = 1.0 - b.power(b.const(beta), tf)
    c1 = b.where(later, 1.0 - b.power(b.const(alpha), tf), 1.0)
    r_t = b.where(later, r * b.sqrt(c2) / c1, r)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        gr = x * norm + g
        v2 = v * alpha + gr * (1.0 - alpha)
        h2 = h * beta + gr * gr * (1.0 - beta)
        x2 = x - r_t * (v2 / (b.sqrt(h2) + eps))
        new_x.append(x2 * (1.0 - post) if post else x2)
        new_v.append(v2)
        new_h.append(h2)
    return new_x + new_v + new_h


def _b_adagrad(im, ins, at):
    b = im.b
    r, t, (xs, gs, hs) = _groups(im, ins, 3)
    eps, norm = float(at.get("epsilon", 1e-6)), float(at.get("norm_coefficient", 0.0))
    r_t = r / (_as_float(b, t) * float(at.get("decay_factor", 0.0)) + 1.0)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        gr = x * norm + g
        h2 = h + gr * gr
        new_x.append(x - r_t * gr / (b.sqrt(h2) + eps))
        new_h.append(h2)
    return new_x + new_h


BUILD_EXTRA_MATH = {
    **{op: _unary(kind) for op, kind in UNARY.items()},
    "Round": lambda im, ins, at: im.b.round(im.tensor(ins[0])),
    "Det": _b_det,
    "CumProd": _b_cumprod,
    "BitCast": _b_bitcast,
    "ConstantOfShape": _b_constant_of_shape,
    "SwiGLU": _b_swiglu,
    "BatchNormalization": _b_batch_norm,
    TRAINING + "Momentum": _b_momentum,
    TRAINING + "Adam": _b_adam,
    TRAINING + "Adagrad": _b_adagrad,
}
EXTRA_MATH_INT_OK = frozenset({"CumProd", "BitCast"})
# inputs that may be integer tensors: the shape, the training ops' update count T
EXTRA_MATH_PARAM_INPUTS = {"ConstantOfShape": (0,), "CumProd": (1,), TRAINING + "Momentum": (1,),
                           TRAINING + "Adam": (1,), TRAINING + "Adagrad": (1,)}

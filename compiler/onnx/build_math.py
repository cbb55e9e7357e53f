"""Graph builders for elementwise math, activations, comparisons, reductions, MatMul,
Gemm and Einsum. Each takes (importer, input names, attributes) and returns the
output value(s): Tensors, or numpy arrays for outputs known at import time."""
from __future__ import annotations

import numpy as np

from ..ir.builder import Tensor
from .common import BOOL_TYPE, FLOAT_TYPES, INT_TYPES, flatten_shape, Known


def _unary(opname):
    return lambda im, ins, at: im.b.op(opname, im.tensor(ins[0]))


def _binary(opname):
    def build(im, ins, at):
        a, c = im.pair(ins[0], ins[1])
        return im.b.op(opname, a, c)
    return build


def _minimum(im, a: Tensor, c: Tensor) -> Tensor:
    return -im.b.op("maximum", -a, -c)


def _variadic(fn):
    def build(im, ins, at):
        out = im.tensor(ins[0])
        for name in ins[1:]:
            out = fn(im, out, im.operand(name, out))
        return out
    return build


def _b_mean(im, ins, at):
    return _variadic(lambda im, a, c: a + c)(im, ins, at) * (1.0 / len(ins))


def _b_abs(im, ins, at):
    x = im.tensor(ins[0])
    return im.b.op("maximum", x, -x)


def _where_pos(im, x: Tensor, pos, neg) -> Tensor:
    """pos where x > 0, else neg (NaN takes neg)."""
    return im.b.op("where", im.b.op("step", x), pos, neg)


def _clamp01(im, y):
    return im.b.op("maximum", _minimum(im, y, im.b.const(1.0)), 0.0)


def _b_leaky_relu(im, ins, at):
    x = im.tensor(ins[0])
    return _where_pos(im, x, x, x * float(at.get("alpha", 0.01)))


def _b_prelu(im, ins, at):
    x = im.tensor(ins[0])
    return _where_pos(im, x, x, x * im.operand(ins[1], x))


def _b_elu(im, ins, at):
    x = im.tensor(ins[0])
    return _where_pos(im, x, x, (im.b.exp(x) - 1.0) * float(at.get("alpha", 1.0)))


def _b_selu(im, ins, at):
    x = im.tensor(ins[0])
    alpha, gamma = float(at.get("alpha", 1.67326319217681884765625)), float(at.get("gamma", 1.05070102214813232421875))
    return _where_pos(im, x, x * gamma, im.b.exp(x) * (alpha * gamma) - alpha * gamma)


def _b_celu(im, ins, at):
    x = im.tensor(ins[0])
    alpha = float(at.get("alpha", 1.0))
    neg = (im.b.exp(x * (1.0 / alpha) if alpha != 1.0 else x) - 1.0) * alpha
    return im.b.relu(x) + _minimum(im, neg, im.b.const(0.0))


def _b_thresholded_relu(im, ins, at):
    x = im.tensor(ins[0])
    return im.b.op("where", im.b.op("step", x - float(at.get("alpha", 1.0))), x, 0.0)


def _b_hard_sigmoid(im, ins, at):
    x = im.tensor(ins[0])
    return _clamp01(im, x * float(at.get("alpha", 0.2)) + float(at.get("beta", 0.5)))


def _b_hard_swish(im, ins, at):
    x = im.tensor(ins[0])
    return x * _clamp01(im, x * (1.0 / 6.0) + 0.5)


def _b_softsign(im, ins, at):
    x = im.tensor(ins[0])
    return x / (_b_abs(im, ins, at) + 1.0)


def _b_mish(im, ins, at):
    x = im.tensor(ins[0])
    return x * im.b.tanh(im.b.softplus(x))


def _b_swish(im, ins, at):
    x = im.tensor(ins[0])
    alpha = float(at.get("alpha", 1.0))
    return im.b.silu(x) if alpha == 1.0 else x * im.b.sigmoid(x * alpha)


def _b_shrink(im, ins, at):
    x = im.tensor(ins[0])
    bias, lambd = float(at.get("bias", 0.0)), float(at.get("lambd", 0.5))
    inner = im.b.op("where", im.b.op("step", -x - lambd), x + bias, 0.0)
    return im.b.op("where", im.b.op("step", x - lambd), x - bias, inner)


def _b_sign(im, ins, at):
    x = im.tensor(ins[0])
    return im.b.step(x) - im.b.step(-x)


def _b_gemm(im, ins, at):
    b = im.b
    y = b.matmul(im.tensor(ins[0]), im.tensor(ins[1]), trans_a=bool(at.get("transA", 0)),
                 trans_b=bool(at.get("transB", 0)))
    if at.get("alpha", 1.0) != 1.0:
        y = y * float(at["alpha"])
    if len(ins) > 2 and ins[2]:
        c = im.operand(ins[2], y)
        if at.get("beta", 1.0) != 1.0:
            c = c * float(at["beta"])
        y = y + c
    return y


def _b_matmul(im, ins, at):
    a, c = im.tensor(ins[0]), im.tensor(ins[1])
    trans_b = False
    node = im.b.g.nodes[c.id]
    rank = len(c.shape)
    if node.op == "transpose" and rank >= 2 and tuple(node.attr("perm")) == (
            tuple(range(rank - 2)) + (rank - 1, rank - 2)):
        c, trans_b = Tensor(im.b, node.inputs[0]), True  # x @ W.T without the transpose
    return im.b.matmul(a, c, trans_b=trans_b)


def _b_pow(im, ins, at):
    c = np.asarray(im.known(ins[1], "the exponent"))
    if c.size != 1:
        raise NotImplementedError(f"node {im.label!r}: Pow needs a one-element exponent, got {list(c.shape)}")
    x, c = im.tensor(ins[0]), float(c.reshape(()))
    return x if c == 1.0 else im.b.pow(x, c)


def _b_cast(im, ins, at, to=None):
    x = im.tensor(ins[0])
    to = at["to"] if to is None else to
    if to == BOOL_TYPE:
        return im.mask_of(ins[0])
    if to in FLOAT_TYPES:
        return x if x.dtype == "f32" else im.b.op("cast", x, to="f32")
    if to in INT_TYPES:
        return x if x.dtype == "i32" else im.b.op("cast", x, to="i32")
    raise NotImplementedError(f"node {im.label!r}: Cast to ONNX type {to} is not supported")


def _b_cast_like(im, ins, at):
    from onnx import helper

    like = im.env[ins[1]]
    if isinstance(like, Known):
        to = helper.np_dtype_to_tensor_dtype(like.value.dtype)
    else:
        to = 1 if like.dtype == "f32" and like.id not in im.masks else BOOL_TYPE if like.dtype == "f32" else 6
    src = im.env[ins[0]]
    if isinstance(src, Known) and src.kind == "const":  # a constant cast like a tensor stays known
        return src.value.astype(helper.tensor_dtype_to_np_dtype(to))
    return _b_cast(im, ins, at, to)


def _b_clip(im, ins, at):
    y = im.tensor(ins[0])
    lo = at.get("min", im.opt(ins, 1, "min"))
    hi = at.get("max", im.opt(ins, 2, "max"))
    if lo is not None:
        y = im.b.op("maximum", y, float(np.asarray(lo).reshape(())))
    if hi is not None:
        y = _minimum(im, y, im.b.const(float(np.asarray(hi).reshape(()))))
    return y


# ------------------------------------------------------------- comparisons, logic
def _b_compare(kind):
    """Float comparisons as exact 0/1 masks: a > b is step(a - b) (a - b is never 0 for
    a != b with IEEE subnormals; a device flushing subnormals to zero calls two floats
    closer than 1.2e-38 equal), a == b is the `eq` row."""
    def build(im, ins, at):
        a, c = im.pair(ins[0], ins[1])
        b = im.b
        if kind == "Equal":
            return im.mask(b.op("eq", a, c))
        gt = b.op("step", a - c) if kind.startswith("Greater") else b.op("step", c - a)
        return im.mask(gt + b.op("eq", a, c) if kind.endswith("OrEqual") else gt)
    return build


def _b_not(im, ins, at):
    return im.mask(1.0 - im.mask_of(ins[0]))


def _b_logic(kind):
    def build(im, ins, at):
        a, c = im.mask_of(ins[0]), im.mask_of(ins[1])
        if kind == "And":
            return im.mask(a * c)
        if kind == "Or":
            return im.mask(im.b.op("maximum", a, c))
        d = a - c
        return im.mask(im.b.op("maximum", d, -d))
    return build


# ------------------------------------------------------------------- reductions
def _reduce_args(im, ins, at, x):
    axes = im.axes(ins, at, len(x.shape))
    if axes is None:
        if at.get("noop_with_empty_axes", 0):
            return None, None
        axes = list(range(len(x.shape)))
    return axes, bool(at.get("keepdims", 1))


def _b_reduce(kind):
    def build(im, ins, at):
        b, x = im.b, im.tensor(ins[0])
        axes, keep = _reduce_args(im, ins, at, x)
        if axes is None:  # noop_with_empty_axes: the identity (ReduceSumSquare still squares)
            return {"sum_square": lambda: x * x, "l1": lambda: _b_abs(im, ins, at)}.get(kind, lambda: x)()
        if any(x.shape[a] == 0 for a in axes) or 0 in x.shape:
            raise NotImplementedError(f"node {im.label!r}: reduction of an empty tensor")
        if kind == "min":
            return -b.max(-x, axes, keep)
        if kind in ("sum", "mean", "max"):
            return getattr(b, kind)(x, axes, keep)
        if kind == "sum_square":
            return b.sum(x * x, axes, keep)
        if kind == "l1":
            return b.sum(_b_abs(im, ins, at), axes, keep)
        if kind == "l2":
            return b.sqrt(b.sum(x * x, axes, keep))
        if kind == "log_sum":
            return b.log(b.sum(x, axes, keep))
        m = b.max(x, axes, True)  # log_sum_exp
        y = b.log(b.sum(b.exp(x - m), axes, True)) + m
        return y if keep else b.reshape(y, tuple(d for a, d in enumerate(x.shape) if a not in axes))
    return build


def _b_softmax(opname):
    def build(im, ins, at):
        x = im.tensor(ins[0])
        fn = getattr(im.b, opname)
        if im.opset >= 13:
            return fn(x, at.get("axis", -1))
        # before opset 13: the input is coerced to 2-D at `axis` (default 1)
        shape = x.shape
        flat = im.b.reshape(x, flatten_shape(shape, at.get("axis", 1)))
        return im.b.reshape(fn(flat, -1), shape)
    return build


# ----------------------------------------------------------------------- einsum
def _b_einsum(im, ins, at):
    """One or two operands without repeated or broadcast (...) labels, lowered to
    transposes, sums and one batched matmul."""
    b = im.b
    eq = at["equation"].replace(" ", "")
    lhs, _, out = eq.partition("->")
    terms = lhs.split(",")
    if "." in eq or len(terms) != len(ins) or len(terms) > 2:
        raise NotImplementedError(f"node {im.label!r}: Einsum {eq!r} (only 1-2 operands without '...')")
    if "->" not in eq:
        letters = "".join(terms)
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    xs = [im.tensor(n) for n in ins]
    if any(len(set(t)) != len(t) for t in terms + [out]):
        raise NotImplementedError(f"node {im.label!r}: Einsum {eq!r} with a repeated label (diagonal)")

    def drop(x, t, keep):  # sum out labels that no one else needs
        axes = [i for i, c in enumerate(t) if c not in keep]
        if axes:
            x = b.sum(x, axes, False)
            t = "".join(c for c in t if c in keep)
        return x, t

    if len(xs) == 1:
        x, t = drop(xs[0], terms[0], out)
        return b.transpose(x, [t.index(c) for c in out])
    (x, ta), (y, tb) = drop(xs[0], terms[0], out + terms[1]), drop(xs[1], terms[1], out + terms[0])
    batch = [c for c in ta if c in tb and c in out]
    contract = [c for c in ta if c in tb and c not in out]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    size = {**dict(zip(ta, x.shape)), **dict(zip(tb, y.shape))}
    prod = lambda cs: int(np.prod([size[c] for c in cs]))
    x = b.reshape(b.transpose(x, [ta.index(c) for c in batch + left + contract]),
                  (prod(batch), prod(left), prod(contract)))
    y = b.reshape(b.transpose(y, [tb.index(c) for c in batch + contract + right]),
                  (prod(batch), prod(contract), prod(right)))
    z = b.reshape(b.matmul(x, y), tuple(size[c] for c in batch + left + right))
    got = batch + left + right
    return b.transpose(z, [got.index(c) for c in out])


BUILD_MATH = {
    "Gemm": _b_gemm,
    "MatMul": _b_matmul,
    "Einsum": _b_einsum,
    "Add": _binary("add"),
    "Sub": _binary("sub"),
    "Mul": _binary("mul"),
    "Div": _binary("div"),
    "Max": _variadic(lambda im, a, c: im.b.op("maximum", a, c)),
    "Min": _variadic(_minimum),
    "Sum": _variadic(lambda im, a, c: a + c),
    "Mean": _b_mean,
    "Relu": _unary("relu"),
    "Sigmoid": _unary("sigmoid"),
    "Tanh": _unary("tanh"),
    "Exp": _unary("exp"),
    "Log": _unary("log"),
    "Sqrt": _unary("sqrt"),
    "Neg": _unary("neg"),
    "Erf": _unary("erf"),
    "Softplus": _unary("softplus"),
    "Abs": _b_abs,
    "Sign": _b_sign,
    "Reciprocal": lambda im, ins, at: 1.0 / im.tensor(ins[0]),
    "Gelu": lambda im, ins, at: im.b.gelu(im.tensor(ins[0]), at.get("approximate", "none")),
    "LeakyRelu": _b_leaky_relu,
    "PRelu": _b_prelu,
    "Elu": _b_elu,
    "Selu": _b_selu,
    "Celu": _b_celu,
    "ThresholdedRelu": _b_thresholded_relu,
    "HardSigmoid": _b_hard_sigmoid,
    "HardSwish": _b_hard_swish,
    "Softsign": _b_softsign,
    "Mish": _b_mish,
    "Swish": _b_swish,
    "Shrink": _b_shrink,
    "Pow": _b_pow,
    "Clip": _b_clip,
    "Cast": _b_cast,
    "CastLike": _b_cast_like,
    "Equal": _b_compare("Equal"),
    "Less": _b_compare("Less"),
    "LessOrEqual": _b_compare("LessOrEqual"),
    "Greater": _b_compare("Greater"),
    "GreaterOrEqual": _b_compare("GreaterOrEqual"),
    "Not": _b_not,
    "And": _b_logic("And"),
    "Or": _b_logic("Or"),
    "Xor": _b_logic("Xor"),
    "ReduceSum": _b_reduce("sum"),
    "ReduceMean": _b_reduce("mean"),
    "ReduceMax": _b_reduce("max"),
    "ReduceMin": _b_reduce("min"),
    "ReduceSumSquare": _b_reduce("sum_square"),
    "ReduceL1": _b_reduce("l1"),
    "ReduceL2": _b_reduce("l2"),
    "ReduceLogSum": _b_reduce("log_sum"),
    "ReduceLogSumExp": _b_reduce("log_sum_exp"),
    "Softmax": _b_softmax("softmax"),
    "LogSoftmax": _b_softmax("log_softmax"),
}

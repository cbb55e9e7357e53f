"""Graph builders for elementwise math, activations, comparisons, reductions, MatMul,
Gemm and Einsum. Each takes (importer, input names, attributes) and returns the
output value(s): Tensors, or numpy arrays for outputs known at import time."""
from __future__ import annotations

import numpy as np

from ..ir.builder import Tensor
from .build_extra_math import float_mod, power
from .common import BOOL_TYPE, FLOAT_TYPES, I32_RANGE, INT_TYPES, flatten_shape, Known


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
    return im.b.abs(x) if x.dtype == "i32" else im.b.op("maximum", x, -x)


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
    return im.b.sign(x) if x.dtype == "i32" else im.b.step(x) - im.b.step(-x)


def _b_relu(im, ins, at):
    x = im.tensor(ins[0])
    return im.b.op("maximum", x, 0) if x.dtype == "i32" else im.b.relu(x)


def _b_mod(im, ins, at):
    """fmod=1: the remainder with the dividend's sign (the `mod` row); fmod=0: with the divisor's
    sign, r + b where r is nonzero and its sign differs from b's. Floats: exactly (`float_mod`)."""
    a, c = im.pair(ins[0], ins[1])
    b = im.b
    if a.dtype != "i32":
        return float_mod(im, a, c, bool(at.get("fmod", 0)))
    r = b.mod(a, c)
    if at.get("fmod", 0):
        return r
    differ = 1.0 - b.eq(b.greater(0, r), b.greater(0, c))
    return b.where(differ * (1.0 - b.eq(r, 0)), r + c, r)


def _b_bitshift(im, ins, at):
    a, c = im.pair(ins[0], ins[1])
    return im.b.bitwise(a, c, kind="shl" if at["direction"] == "LEFT" else "shr")


def _b_bitwise(kind):
    def build(im, ins, at):
        a, c = im.pair(ins[0], ins[1])
        return im.b.bitwise(a, c, kind=kind)
    return build


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
    v = im.env[ins[1]]
    if not (isinstance(v, Known) and v.kind == "const" and v.value.size == 1):
        return power(im, ins)  # a tensor exponent
    c = np.asarray(v.value)
    x, c = im.tensor(ins[0]), float(c.reshape(()))
    if x.dtype == "i32":
        return _int_power(im, x, c)
    return x if c == 1.0 else im.b.pow(x, c)


def _int_power(im, x, c: float):
    """An integer tensor to a whole power 0..64, by squaring and multiplying (wrapping as i32 does)."""
    if c != int(c) or not 0 <= c <= 64:
        raise NotImplementedError(f"node {im.label!r}: Pow of an integer tensor to {c:g} (only 0..64)")
    n, out, sq = int(c), None, x
    while n:
        if n & 1:
            out = sq if out is None else out * sq
        n >>= 1
        if n:
            sq = sq * sq
    return out if out is not None else im.b.op("broadcast_to", im.b.const(1, "i32"), shape=x.shape)


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

    def bound(v):  # an integer tensor's bounds, clamped to the 32-bit range its values lie in
        v = np.asarray(v).reshape(())
        return im.b.const(int(np.clip(v, *I32_RANGE)), "i32") if y.dtype == "i32" else im.b.const(float(v))
    if lo is not None:
        y = im.b.op("maximum", y, bound(lo))
    if hi is not None:
        y = _minimum(im, y, bound(hi))
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
        if a.dtype == "i32":  # (a - b would overflow)
            gt = b.greater(a, c) if kind.startswith("Greater") else b.greater(c, a)
        else:
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
        if x.dtype == "i32" and kind not in ("sum", "max", "min"):
            raise NotImplementedError(f"node {im.label!r}: Reduce {kind} of an integer tensor")
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


def _b_arg(smallest):
    def build(im, ins, at):
        return im.b.op("argmax", im.tensor(ins[0]), axis=int(at.get("axis", 0)), keepdims=bool(at.get("keepdims", 1)),
                       last=bool(at.get("select_last_index", 0)) or None, smallest=smallest or None)
    return build


def _b_topk(im, ins, at):
    """Values and indices, best first whatever `sorted` says (ONNX leaves the order then free)."""
    x = im.tensor(ins[0])
    k = int(np.asarray(im.known(ins[1], "K")).reshape(-1)[0]) if len(ins) > 1 else int(at["k"])
    axis = int(at.get("axis", -1)) % len(x.shape)
    if k == 0:
        raise NotImplementedError(f"node {im.label!r}: TopK with K = 0 (empty outputs)")
    return list(im.b.topk(x, k, axis, largest=bool(at.get("largest", 1))))


# ----------------------------------------------------------------------- einsum
def _einsum_terms(im, equation, ranks):
    """Operand and output labels with every '...' spelled out as labels of its own
    (right-aligned across operands, as broadcasting is); implicit output as numpy's."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"node {im.label!r}: Einsum {eq!r} has {len(terms)} terms for {len(ranks)} inputs")
    dots = [r - len(t.replace("...", "")) for t, r in zip(terms, ranks)]
    width = max([d for t, d in zip(terms, dots) if "..." in t] + [0])
    ell = [chr(0x100 + i) for i in range(width)]  # labels no equation uses
    terms = [t.replace("...", "".join(ell[width - d:])) if "..." in t else t for t, d in zip(terms, dots)]
    if not arrow:
        letters = "".join(terms)
        out = "".join(ell) + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell))
    else:
        out = out.replace("...", "".join(ell))
    for t, r in zip(terms, ranks):
        if len(t) != r or not all(c.isalpha() or c in ell for c in t):
            raise ValueError(f"node {im.label!r}: Einsum {eq!r} does not fit inputs of ranks {ranks}")
    if len(set(out)) != len(out) or any(c not in "".join(terms) for c in out):
        raise ValueError(f"node {im.label!r}: Einsum {eq!r} has a bad output")
    return terms, out


def _einsum_diagonal(b, x, t):
    """(x, labels) with each repeated label's diagonal taken: (x, unique labels)."""
    while len(set(t)) < len(t):
        c = next(c for c in t if t.count(c) > 1)
        p0 = t.index(c)
        p1 = t.index(c, p0 + 1)
        n = x.shape[p0]
        rest = [a for a in range(len(t)) if a not in (p0, p1)]
        x = b.reshape(b.transpose(x, rest + [p0, p1]), tuple(x.shape[a] for a in rest) + (n * n,))
        rank = len(x.shape)
        x = b.slice(x, starts=(0,) * rank, steps=(1,) * (rank - 1) + (n + 1,), shape=x.shape[:-1] + (n,))
        t = "".join(t[a] for a in rest) + c
    return x, t


def _einsum_sum(b, x, t, keep):
    """Sum out the labels not in `keep`."""
    axes = [a for a, c in enumerate(t) if c not in keep]
    if not axes:
        return x, t
    return b.sum(x, axes, False), "".join(c for c in t if c in keep)


def _einsum_pair(b, x, t, y, u, keep, size):
    """The product of two operands, labels outside `keep` summed: a batched matmul (a
    broadcasting mul when nothing is summed)."""
    x, t = _einsum_sum(b, x, t, keep | set(u))
    y, u = _einsum_sum(b, y, u, keep | set(t))
    batch = [c for c in t if c in u and c in keep]
    contract = [c for c in t if c in u and c not in keep]
    left, right = [c for c in t if c not in u], [c for c in u if c not in t]
    for c in batch + contract:  # a shared label of size 1 on one side broadcasts
        if x.shape[t.index(c)] != size[c]:
            x = b.op("broadcast_to", x, shape=tuple(size[k] if k == c else d for k, d in zip(t, x.shape)))
        if y.shape[u.index(c)] != size[c]:
            y = b.op("broadcast_to", y, shape=tuple(size[k] if k == c else d for k, d in zip(u, y.shape)))
    dims = lambda cs: tuple(size[c] for c in cs)
    prod = lambda cs: int(np.prod(dims(cs)))
    if not contract:
        xm = b.reshape(b.transpose(x, [t.index(c) for c in batch + left]), dims(batch + left) + (1,) * len(right))
        ym = b.reshape(b.transpose(y, [u.index(c) for c in batch + right]),
                       dims(batch) + (1,) * len(left) + dims(right))
        return xm * ym, "".join(batch + left + right)
    xm = b.reshape(b.transpose(x, [t.index(c) for c in batch + left + contract]),
                   (prod(batch), prod(left), prod(contract)))
    ym = b.reshape(b.transpose(y, [u.index(c) for c in batch + contract + right]),
                   (prod(batch), prod(contract), prod(right)))
    return b.reshape(b.matmul(xm, ym), dims(batch + left + right)), "".join(batch + left + right)


def _b_einsum(im, ins, at):
    """Any equation torch.einsum accepts (repeated labels: diagonals; '...'; sums; outer
    products), lowered to slices, transposes, reshapes, sums, broadcasting muls and
    batched matmuls, operands combined left to right."""
    b = im.b
    xs = [im.tensor(n) for n in ins]
    terms, out = _einsum_terms(im, at["equation"], [len(x.shape) for x in xs])
    ops = [_einsum_diagonal(b, x, t) for x, t in zip(xs, terms)]
    size = {}
    for x, t in ops:
        for c, d in zip(t, x.shape):
            if size.get(c, 1) not in (1, d) and d != 1:
                raise ValueError(f"node {im.label!r}: Einsum label {c!r} has sizes {size[c]} and {d}")
            size[c] = max(size.get(c, 1), d)
    x, t = ops[0]
    for k in range(1, len(ops)):
        keep = set(out).union(*(set(u) for _, u in ops[k + 1:]))
        x, t = _einsum_pair(b, x, t, *ops[k], keep, size)
    x, t = _einsum_sum(b, x, t, set(out))
    return b.transpose(x, [t.index(c) for c in out])


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
    "Relu": _b_relu,
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
    "Mod": _b_mod,
    "BitShift": _b_bitshift,
    "BitwiseAnd": _b_bitwise("and"),
    "BitwiseOr": _b_bitwise("or"),
    "BitwiseXor": _b_bitwise("xor"),
    "BitwiseNot": lambda im, ins, at: im.b.bit_not(im.tensor(ins[0])),
    "ArgMax": _b_arg(False),
    "ArgMin": _b_arg(True),
    "TopK": _b_topk,
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

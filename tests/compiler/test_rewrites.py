"""Rewrites keep the interpreter's answer: run_graph(g) == run_graph(prepare(g)).

prepare() decomposes ops (cross_entropy, mse), splits reductions over non-adjacent axes,
merges common subexpressions and drops dead nodes. Each graph here runs through the
float64 interpreter before and after, on random inputs, and every output and every
assign (updated weights and optimizer state) must agree to 1e-12 relative.
"""
from __future__ import annotations

import numpy as np
import pytest
from meganeura.compiler.ir.autodiff import gradients
from meganeura.compiler.ir.builder import Builder
from meganeura.compiler.ir.emit import Emitter
from meganeura.compiler.ir.interpret import run_graph
from meganeura.compiler.ir.graph import Graph, Node, make_attrs
from meganeura.compiler.ir.ops import OPS
from meganeura.compiler.passes.prepare import prepare
from meganeura.compiler.passes.reductions import reduce_geometry
from meganeura.compiler.ir.training import ROW_MASK, TrainConfig, build_training_graph

TOL = 1e-12


def rel(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert x.shape == ref.shape, (x.shape, ref.shape)
    assert np.isfinite(ref).all(), "the reference itself is not finite: a bad test input"
    if ref.size == 0:
        return 0.0
    return float(np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-300))


def check_prepare_keeps_answer(graph, inputs, values=None):
    """prepare(graph), then compare the interpreter on both; returns the prepared graph."""
    after = prepare(graph)
    o1, a1 = run_graph(graph, inputs, np.float64, values)
    o2, a2 = run_graph(after, inputs, np.float64, values)
    assert set(o1) == set(o2) and set(a1) == set(a2), (sorted(o1), sorted(o2), sorted(a1), sorted(a2))
    assert o1 or a1, "the graph computes nothing"
    bad = []
    for kind, d1, d2 in (("output", o1, o2), ("assign", a1, a2)):
        for k in sorted(d1):
            e = rel(d2[k], d1[k])
            if not e <= TOL:
                bad.append(f"{kind} {k}: relative difference {e:.3g}")
    assert not bad, "\n".join(bad)
    _check_prepared_form(after)
    return after


def _check_prepared_form(g):
    """What prepare promises the scheduler: no decompose ops, reductions that one kernel
    walks (one run of adjacent axes, or all axes around one run of kept ones), inputs
    before users."""
    for i, n in enumerate(g.nodes):
        assert OPS[n.op].lowering[0] != "decompose", f"%{i} {n.op} survived prepare"
        assert all(j < i for j in n.inputs), f"%{i} reads a later node"
        if n.op in ("reduce_sum", "reduce_max"):
            assert reduce_geometry(g.nodes[n.inputs[0]].shape, n.attr("axes")) is not None, \
                f"%{i} {n.op} over axes {n.attr('axes')}"


# ------------------------------------------------------------ training graphs
def _mlp(rng, act="gelu", out=5):
    b = Builder()
    x = b.input("x", (9, 13))
    w1 = b.param("fc1.weight", rng.standard_normal((17, 13)) * 0.4)
    b1 = b.param("fc1.bias", rng.standard_normal(17) * 0.1)
    w2 = b.param("fc2.weight", rng.standard_normal((out, 17)) * 0.4)
    b2 = b.param("fc2.bias", rng.standard_normal(out) * 0.1)
    h = b.gelu(b.linear(x, w1, b1)) if act == "gelu" else b.relu(b.linear(x, w1, b1))
    b.output("logits", b.linear(h, w2, b2))
    return b.build()


TRAIN_CONFIGS = {
    "ce-sgd-clip": TrainConfig(loss="cross_entropy", optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.01,
                               clip_norm=0.05),
    "ce-adamw-clip": TrainConfig(loss="cross_entropy", optimizer="adamw", lr=1e-2, clip_norm=0.05),
    "ce-adamw-noclip": TrainConfig(loss="cross_entropy", optimizer="adamw", lr=1e-2, clip_norm=100.0),
    "mse-sgd-clip": TrainConfig(loss="mse", optimizer="sgd", lr=0.1, momentum=0.0, clip_norm=0.05),
    "mse-adamw-clip-frozen": TrainConfig(loss="mse", optimizer="adamw", lr=1e-2, clip_norm=0.05,
                                         freeze=["fc1.*"]),
}


@pytest.mark.parametrize("name", sorted(TRAIN_CONFIGS))
def test_training_graph(name):
    cfg = TRAIN_CONFIGS[name]
    rng = np.random.default_rng(7)
    model = _mlp(rng, act="gelu" if "ce" in name else "relu")
    g = build_training_graph(model.graph, cfg)
    inputs = {"x": rng.standard_normal((9, 13)), ROW_MASK: (np.arange(9) % 4 != 3).astype(np.float64)}
    if cfg.loss == "cross_entropy":
        inputs["labels"] = rng.integers(0, 5, 9).astype(np.int32)
    else:
        inputs["labels"] = rng.standard_normal((9, 5))
    # optimizer state mid-training, so every term of the update matters
    values = {}
    for sname, i in g.leaves("state").items():
        shape = g.nodes[i].shape
        if sname == "optimizer.step":
            values[sname] = np.float64(3.0)
        elif sname.endswith("exp_avg_sq"):
            values[sname] = rng.uniform(0.01, 0.1, shape)
        elif sname != "optimizer.lr":
            values[sname] = rng.standard_normal(shape) * 0.1
    after = check_prepare_keeps_answer(g, inputs, values)
    assert "loss" in after.outputs and after.assigns, "the training step lost its loss or its updates"
    # the test only means something if clipping was active in the clipped configurations
    _, _, env = run_graph(g, inputs, np.float64, values, keep_all=True)
    sqrt_nodes = [i for i, n in enumerate(g.nodes) if n.op == "sqrt" and env[i] is not None and env[i].ndim == 0]
    if cfg.clip_norm is not None and cfg.clip_norm < 1:
        assert any(env[i] > cfg.clip_norm for i in sqrt_nodes), "the gradient norm never exceeds clip_norm"


# ------------------------------------------------------------ reductions over scattered axes
def test_reductions_over_non_adjacent_axes():
    rng = np.random.default_rng(11)
    b = Builder()
    x = b.input("x", (3, 4, 5, 6))
    outs = {
        "s02k": b.sum(x, (0, 2), True),
        "s13": b.sum(x, (1, 3), False),
        "s03k": b.sum(x, (0, 3), True),
        "s_neg": b.sum(x, (-1, -3), False),
        "s_all": b.sum(x, None, False),
        "s_none": b.sum(x, (), False),
        "m02": b.max(x, (0, 2), False),
        "m013k": b.max(x, (0, 1, 3), True),
        "m13": b.max(x, (3, 1), False),
        "mean023": b.mean(x, (0, 2, 3), True),
    }
    for k, t in outs.items():
        b.output(k, t)
    # and their gradients, which broadcast back over the same axes
    ct = b.input("ct", (3, 5))
    loss = b.sum(outs["s13"] * outs["m13"] * ct)
    loss = loss + b.sum(outs["s02k"] * outs["m013k"]) + b.sum(b.exp(b.tanh(outs["mean023"])))
    grads = gradients(b.e, loss.id, [x.id, ct.id])
    b.g.outputs["grad_x"] = grads[x.id]
    b.g.outputs["grad_ct"] = grads[ct.id]
    inputs = {"x": rng.standard_normal((3, 4, 5, 6)), "ct": rng.standard_normal((3, 5))}
    after = check_prepare_keeps_answer(b.g, inputs)
    walked = {tuple(sorted(n.attr("axes"))) for n in after.nodes if n.op in ("reduce_sum", "reduce_max")}
    assert (0, 2, 3) in walked and (0, 3) in walked, walked  # around one kept run: one kernel each
    assert (0, 2) not in walked and (1, 3) not in walked, walked  # two kept runs: split


# ------------------------------------------------------------ common subexpressions
def test_duplicate_subexpressions():
    rng = np.random.default_rng(5)
    b = Builder()
    a = b.input("a", (7, 13))
    c = b.input("c", (13,))
    y1 = b.exp(b.tanh(a)) * c
    y2 = b.exp(b.tanh(a)) * c  # the same again, as separate nodes
    s1 = b.sum(y1 * y1, (1,), False)
    s2 = b.sum(y2 * y2, (1,), False)
    # an equal constant made twice (bypassing Emitter.const's sharing)
    k1 = b.g.add(Node("const", "f32", (), (), make_attrs(value=0.5)))
    k2 = b.g.add(Node("const", "f32", (), (), make_attrs(value=0.5)))
    z = b.op("add", b.op("mul", s1, Tensorish(b, k1)), b.op("mul", s2, Tensorish(b, k2)))
    b.output("z", z)
    b.output("y1", y1)
    b.output("y2", y2)
    dead = b.sqrt(b.exp(a))  # never read: dropped
    assert dead.id > 0
    loss = b.sum(z)
    grads = gradients(b.e, loss.id, [a.id, c.id])
    b.g.outputs["grad_a"] = grads[a.id]
    b.g.outputs["grad_c"] = grads[c.id]
    inputs = {"a": rng.standard_normal((7, 13)), "c": rng.standard_normal(13)}
    before_exp = sum(n.op == "exp" for n in b.g.nodes)
    after = check_prepare_keeps_answer(b.g, inputs)
    assert sum(n.op == "exp" for n in after.nodes) == 1 < before_exp, "the duplicate exp(tanh(a)) was not merged"
    assert sum(n.op == "sqrt" for n in after.nodes) == 0, "a dead node survived"
    assert after.outputs["y1"] == after.outputs["y2"]
    keys = [(n.op, n.shape, n.inputs, n.attrs) for n in after.nodes if n.op not in ("input", "param", "state")]
    assert len(keys) == len(set(keys)), "prepare left two identical nodes"


def Tensorish(b, node_id):
    from meganeura.compiler.ir.builder import Tensor

    return Tensor(b, node_id)


# ------------------------------------------------------------ random graphs
UNARY = ["neg", "tanh", "sigmoid", "relu", "gelu", "exp_tanh", "sqrt_abs", "log_sig"]
BINARY = ["add", "sub", "mul", "maximum", "div_safe"]


def _random_graph(seed):
    rng = np.random.default_rng(seed)
    g = Graph()
    e = Emitter(g)
    shapes = [(3, 4, 5), (4, 5), (5,), (3, 1, 5), (1, 4, 1)]
    pool = [e.leaf("input", f"x{i}", s) for i, s in enumerate(shapes)]
    inputs = {f"x{i}": rng.standard_normal(s) for i, s in enumerate(shapes)}
    pool.append(e.leaf("param", "w", (5, 6), "f32", rng.standard_normal((5, 6))))
    for _ in range(40):
        kind = rng.choice(["unary", "binary", "reduce", "transpose", "reshape", "softmax", "matmul", "dup"],
                          p=[0.22, 0.25, 0.15, 0.08, 0.08, 0.07, 0.1, 0.05])
        x = int(rng.choice(pool))
        xs = e.shape(x)
        if kind == "unary":
            op = rng.choice(UNARY)
            if op == "exp_tanh":
                y = e.op("exp", e.op("tanh", x))
            elif op == "sqrt_abs":
                y = e.op("sqrt", e.op("add", e.op("mul", x, x), e.const(0.1)))
            elif op == "log_sig":
                y = e.op("log", e.op("sigmoid", x))
            elif op == "gelu":
                y = e.op("gelu", x, approximate=str(rng.choice(["none", "tanh"])))
            else:
                y = e.op(str(op), x)
        elif kind == "binary":
            fits = [p for p in pool if _broadcastable(xs, e.shape(p))]
            z = int(rng.choice(fits))
            op = rng.choice(BINARY)
            if op == "div_safe":
                y = e.op("div", x, e.op("add", e.op("mul", z, z), e.const(1.0)))
            else:
                y = e.op(str(op), x, z)
        elif kind == "reduce" and xs:
            k = int(rng.integers(1, len(xs) + 1))
            axes = tuple(sorted(int(a) for a in rng.choice(len(xs), k, replace=False)))
            y = e.op(str(rng.choice(["reduce_sum", "reduce_max"])), x, axes=axes, keepdims=bool(rng.integers(2)))
        elif kind == "transpose" and len(xs) > 1:
            y = e.op("transpose", x, perm=tuple(int(p) for p in rng.permutation(len(xs))))
        elif kind == "reshape" and xs:
            y = e.reshape(x, (int(np.prod(xs)),) if len(xs) > 1 else (1,) + xs)
        elif kind == "softmax" and xs:
            y = e.op(str(rng.choice(["softmax", "log_softmax"])), x)
        elif kind == "matmul" and len(xs) >= 2 and xs[-1] == 5:
            y = e.op("matmul", x, pool[5])
        elif kind == "dup" and len(pool) > 7:
            # re-emit an existing op node: a common subexpression for prepare to merge
            n = g.nodes[int(rng.choice(pool[6:]))]
            y = g.add(Node(n.op, n.dtype, n.shape, n.inputs, n.attrs))
        else:
            continue
        if g.nodes[y].shape and np.prod(g.nodes[y].shape) <= 400:
            pool.append(y)
    outs = [p for p in pool[6:] if g.nodes[p].shape][-6:]
    for k, p in enumerate(outs):
        g.outputs[f"o{k}"] = p
    # gradients of a scalar made of the outputs, w.r.t. every leaf
    total = None
    for p in outs:
        s = e.op("reduce_sum", e.op("mul", p, p), axes=tuple(range(len(g.nodes[p].shape))), keepdims=False)
        total = s if total is None else e.op("add", total, s)
    grads = gradients(e, total, pool[:6])
    for leaf, gid in grads.items():
        g.outputs[f"grad_{leaf}"] = gid
    return g, inputs


def _broadcastable(a, b):
    try:
        return np.broadcast_shapes(a, b) is not None
    except ValueError:
        return False


@pytest.mark.parametrize("seed", range(6))
def test_random_graph(seed):
    g, inputs = _random_graph(seed)
    assert len(g.outputs) >= 2
    check_prepare_keeps_answer(g, inputs)


# ------------------------------------------------------------ pointwise convolutions
def test_pointwise_convolutions_become_matmuls():
    """A 1x1 stride-1 convolution and its input gradient are matmuls after prepare (the weight
    gradient stays a convolution kernel); strided or padded ones stay convolutions. Answers kept."""
    rng = np.random.default_rng(21)
    b = Builder()
    x = b.input("x", (2, 5, 6, 7))
    w1 = b.param("w1", rng.standard_normal((8, 5, 1, 1)))
    w2 = b.param("w2", rng.standard_normal((3, 8, 1, 1)))
    y = b.conv2d(x, w1)
    z = b.conv2d(y, w2, stride=(2, 2))  # strided: stays a convolution
    b.output("z", z)
    grads = gradients(b.e, b.sum(z * z).id, [x.id, w1.id])
    b.g.outputs.update(gx=grads[x.id], gw=grads[w1.id])
    after = check_prepare_keeps_answer(b.g, {"x": rng.standard_normal((2, 5, 6, 7))})
    ops = [n.op for n in after.nodes]
    assert ops.count("conv2d") == 1 and "conv2d_weight_grad" in ops, ops  # the strided one; w1's gradient
    assert ops.count("matmul") == 2, ops  # w1's forward and its input gradient (conv_transpose2d)

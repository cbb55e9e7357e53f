"""ONNX attention-family ops: Attention with an external cache's nonpad_kv_seqlen (the
lengths read at run time), ai.onnx.preview FlexAttention with score_mod / prob_mod
subgraphs, LinearAttention (all four update rules, GQA, a past state) and
CausalConvWithState: one-node models imported, differentiated with respect to their float
inputs, and compared on full tensors with torch autograd in float64 (the interpreter,
1e-9; the GPU, 1e-4)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from meganeura.compiler import Builder, run_graph
from meganeura.compiler.ir.autodiff import gradients
from meganeura.compiler.onnx_import import load_onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

OPSETS = [helper.make_opsetid("", 27), helper.make_opsetid("ai.onnx.preview", 1)]


def _model(op, feed, order, outs, attrs, domain=""):
    """A one-node model: inputs named as `feed` (float32, or int64 for integer arrays),
    node inputs in `order` ("" for an absent one), outputs `outs`."""
    inputs = [helper.make_tensor_value_info(k, TensorProto.INT64 if v.dtype.kind in "iu" else TensorProto.FLOAT,
                                            v.shape) for k, v in feed.items()]
    node = helper.make_node(op, order, outs, domain=domain, **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                    for o in outs])
    return helper.make_model(graph, opset_imports=OPSETS)


def _graph_with_grads(model, feed):
    """(graph with the model's outputs and grad_<input> of sum(out * ct_<out>), values with
    the cotangents, float input names)."""
    m = load_onnx(model)
    b = Builder.extend(m)
    outs = dict(b.outputs)
    wrt = [k for k, v in feed.items() if v.dtype.kind == "f"]
    ids = [b.g.named[("input", k)] for k in wrt]
    loss = None
    for name, y in outs.items():
        term = b.sum(y * b.input(f"ct_{name}", y.shape))
        loss = term if loss is None else loss + term
    grads = gradients(b.e, loss.id, ids)
    for k, i in zip(wrt, ids):
        b.g.outputs[f"grad_{k}"] = grads[i]
    rng = np.random.default_rng(len(feed))
    cts = {f"ct_{n}": rng.standard_normal(y.shape).astype(np.float32).astype(np.float64) for n, y in outs.items()}
    return b.g, {**feed, **cts}, wrt, list(outs)


def _torch(fn, feed, vals, wrt, names):
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=k in wrt) if v.dtype.kind == "f"
         else torch.tensor(v.astype(np.int64)) for k, v in feed.items()}
    ys = fn(**t)
    ys = ys if isinstance(ys, tuple) else (ys,)
    loss = sum((y * torch.tensor(vals[f"ct_{n}"])).sum() for n, y in zip(names, ys))
    grads = torch.autograd.grad(loss, [t[k] for k in wrt])
    return {**{n: y.detach().numpy() for n, y in zip(names, ys)},
            **{f"grad_{k}": g.numpy() for k, g in zip(wrt, grads)}}


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _f(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(np.float64)


def _check(model, feed, fn, run_on_gpu=None):
    """Outputs and gradients: interpreter (float64) and, given run_on_gpu, the GPU vs torch."""
    g, vals, wrt, names = _graph_with_grads(model, feed)
    ref = _torch(fn, feed, vals, wrt, names)
    got = run_graph(g, vals, np.float64)[0]
    assert set(got) == set(ref)
    for k in ref:
        assert _rel(got[k], ref[k]) < 1e-9, f"{k}: interpreter vs torch"
    if run_on_gpu is not None:
        gpu = run_on_gpu(g, vals)
        for k in ref:
            assert _rel(gpu[k], ref[k]) < 1e-4, f"{k}: GPU vs torch"
    return g


R = np.random.default_rng(27)


# ----------------------------------------------------------- Attention, nonpad
def _nonpad_attention(causal=0, left=-1, right=-1, scale=None):
    """torch: SDPA with the external cache's padding, causal and window bias; K and V
    repeated per query-head group."""
    def fn(Q, K, V, nonpad_kv_seqlen, attn_mask=None):
        s, t = Q.shape[2], K.shape[2]
        i, j = torch.arange(s)[:, None], torch.arange(t)[None, :]
        n = nonpad_kv_seqlen[:, None, None]
        p = n - s + i  # each query's position after the valid keys
        allowed = j < n
        if causal:
            allowed = allowed & (j <= p)
        if left >= 0:
            allowed = allowed & (p - j <= left)
        if right >= 0:
            allowed = allowed & (j - p <= right)
        bias = torch.where(allowed, 0.0, float("-inf")).to(torch.float64)[:, None]
        if attn_mask is not None:
            bias = bias + attn_mask
        rep = Q.shape[1] // K.shape[1]
        return F.scaled_dot_product_attention(Q, K.repeat_interleave(rep, 1), V.repeat_interleave(rep, 1),
                                              attn_mask=bias, scale=scale)
    return fn


def test_attention_nonpad_causal_window_mask_gqa(run_on_gpu):
    """GQA, causal after nonpad[b] - S keys, a left window and a float mask: one compiled
    graph, two sets of lengths, both against torch on the GPU."""
    q, k, v, mask = _f(R, 2, 4, 3, 8), _f(R, 2, 2, 7, 8), _f(R, 2, 2, 7, 5), _f(R, 4, 3, 7, scale=0.5)
    feed = {"Q": q, "K": k, "V": v, "attn_mask": mask, "nonpad_kv_seqlen": np.array([7, 5])}
    attrs = {"is_causal": 1, "left_window_size": 3}
    model = _model("Attention", feed, ["Q", "K", "V", "attn_mask", "", "", "nonpad_kv_seqlen"], ["Y"], attrs)
    fn = _nonpad_attention(causal=1, left=3)
    g = _check(model, feed, fn, run_on_gpu)
    # the lengths are read at run time: other lengths, the same graph
    feed2 = {**feed, "nonpad_kv_seqlen": np.array([4, 6])}
    _, vals, wrt, names = _graph_with_grads(model, feed2)
    ref = _torch(fn, feed2, vals, wrt, names)
    gpu = run_on_gpu(g, vals)
    for key in ref:
        assert _rel(gpu[key], ref[key]) < 1e-4, f"{key}: GPU vs torch, lengths {feed2['nonpad_kv_seqlen']}"


def test_attention_nonpad_3d_heads_right_window_scaled():
    q, k, v = _f(R, 2, 3, 12), _f(R, 2, 5, 6), _f(R, 2, 5, 6)
    feed = {"Q": q, "K": k, "V": v, "nonpad_kv_seqlen": np.array([5, 4])}
    attrs = {"q_num_heads": 2, "kv_num_heads": 1, "left_window_size": 2, "right_window_size": 1, "scale": 0.3}
    model = _model("Attention", feed, ["Q", "K", "V", "", "", "", "nonpad_kv_seqlen"], ["Y"], attrs)
    inner = _nonpad_attention(left=2, right=1, scale=float(np.float32(0.3)))  # (a float32 attribute)

    def fn(Q, K, V, nonpad_kv_seqlen):
        heads = [x.reshape(2, x.shape[1], h, -1).transpose(1, 2) for x, h in ((Q, 2), (K, 1), (V, 1))]
        y = inner(*heads, nonpad_kv_seqlen)
        return y.transpose(1, 2).reshape(2, 3, -1)
    _check(model, feed, fn)


def test_attention_nonpad_fully_masked_rows_are_zero(run_on_gpu):
    """nonpad < S: the first queries see no key; their rows are 0, as the ONNX reference."""
    q, k, v = _f(R, 1, 2, 4, 8), _f(R, 1, 2, 4, 8), _f(R, 1, 2, 4, 8)
    feed = {"Q": q, "K": k, "V": v, "nonpad_kv_seqlen": np.array([2])}
    model = _model("Attention", feed, ["Q", "K", "V", "", "", "", "nonpad_kv_seqlen"], ["Y"], {"is_causal": 1})
    want = ReferenceEvaluator(model).run(None, {k_: v_.astype(np.float32) if v_.dtype.kind == "f" else v_
                                                for k_, v_ in feed.items()})[0]
    g = load_onnx(model).graph
    with np.errstate(invalid="ignore"):  # (the softmax of a row of -inf, then replaced by 0)
        got = run_graph(g, feed, np.float64)[0]["Y"]
    assert not got[0, :, :2].any() and _rel(got, want) < 1e-5
    gpu = run_on_gpu(g, feed)["Y"]
    assert not gpu[0, :, :2].any() and _rel(gpu, want) < 1e-5


# ---------------------------------------------------------------- FlexAttention
def _flex_bodies(t):
    """score_mod: soft cap 5 plus the relative position (q - k), causal; prob_mod: times a
    per-key weight (an initializer of the body)."""
    f = TensorProto.FLOAT
    ints = [numpy_helper.from_array(np.array(x, np.int64), n) for x, n in
            ((0, "zero"), (1, "one"), (2, "i2"), (3, "i3"), ([-1, 1], "qs"), ([1, -1], "ks"))]
    consts = ints + [numpy_helper.from_array(np.array(5.0, np.float32), "cap"),
                     numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf")]
    nodes = [helper.make_node("Div", ["s", "cap"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
             helper.make_node("Mul", ["b", "cap"], ["c"]), helper.make_node("Shape", ["s"], ["shape"]),
             helper.make_node("Gather", ["shape", "i2"], ["L"], axis=0),
             helper.make_node("Gather", ["shape", "i3"], ["S"], axis=0),
             helper.make_node("Range", ["zero", "L", "one"], ["qr"]), helper.make_node("Reshape", ["qr", "qs"], ["qi"]),
             helper.make_node("Range", ["zero", "S", "one"], ["kr"]), helper.make_node("Reshape", ["kr", "ks"], ["ki"]),
             helper.make_node("Sub", ["qi", "ki"], ["rel"]), helper.make_node("Cast", ["rel"], ["relf"], to=f),
             helper.make_node("Add", ["c", "relf"], ["d"]), helper.make_node("GreaterOrEqual", ["qi", "ki"], ["m"]),
             helper.make_node("Where", ["m", "d", "ninf"], ["out"])]
    vi = [helper.make_tensor_value_info(n, f, ["B", "H", "L", "S"]) for n in ("s", "out")]
    score_mod = helper.make_graph(nodes, "score_mod", [vi[0]], [vi[1]], initializer=consts)
    w = numpy_helper.from_array(np.linspace(0.5, 1.5, t).astype(np.float32).reshape(1, 1, 1, t), "w")
    pv = [helper.make_tensor_value_info(n, f, ["B", "H", "L", "S"]) for n in ("p", "pout")]
    prob_mod = helper.make_graph([helper.make_node("Mul", ["p", "w"], ["pout"])], "prob_mod", [pv[0]], [pv[1]],
                                 initializer=[w])
    return score_mod, prob_mod


def test_flex_attention_score_and_prob_mods_gqa(run_on_gpu):
    q, k, v = _f(R, 2, 4, 5, 8), _f(R, 2, 2, 5, 8), _f(R, 2, 2, 5, 6)
    feed = {"Q": q, "K": k, "V": v}
    score_mod, prob_mod = _flex_bodies(5)
    model = _model("FlexAttention", feed, ["Q", "K", "V"], ["Y"],
                   {"score_mod": score_mod, "prob_mod": prob_mod, "scale": 0.4}, domain="ai.onnx.preview")
    weight = torch.tensor(np.linspace(0.5, 1.5, 5).astype(np.float32), dtype=torch.float64)

    def fn(Q, K, V):
        K, V = K.repeat_interleave(2, 1), V.repeat_interleave(2, 1)
        s = Q @ K.transpose(-1, -2) * float(np.float32(0.4))
        rel = (torch.arange(5)[:, None] - torch.arange(5)[None, :]).to(torch.float64)
        s = torch.where(rel >= 0, torch.tanh(s / 5) * 5 + rel, float("-inf"))
        return (torch.softmax(s, -1) * weight) @ V
    _check(model, feed, fn, run_on_gpu)


def test_flex_attention_plain_is_sdpa(run_on_gpu):
    q, k, v = _f(R, 2, 2, 6, 8), _f(R, 2, 2, 4, 8), _f(R, 2, 2, 4, 3)
    feed = {"Q": q, "K": k, "V": v}
    model = _model("FlexAttention", feed, ["Q", "K", "V"], ["Y"], {}, domain="ai.onnx.preview")
    _check(model, feed, lambda Q, K, V: F.scaled_dot_product_attention(Q, K, V), run_on_gpu)


# ------------------------------------------------------------- LinearAttention
def _linear_attention(rule, hq, hk, scale=None, past=False):
    """torch: the recurrence token by token, float64."""
    def fn(query, key, value, past_state=None, decay=None, beta=None):
        b, t, _ = query.shape
        dk, dv = query.shape[2] // hq, value.shape[2] // hk
        q = query.reshape(b, t, hq, dk)
        k, v = key.reshape(b, t, hk, dk), value.reshape(b, t, hk, dv)
        s = past_state if past else torch.zeros(b, hk, dk, dv, dtype=torch.float64)
        sc = float(np.float32(scale)) if scale else dk ** -0.5
        outs = []
        for i in range(t):
            if decay is not None:
                g = decay[:, i].reshape(b, hk, -1, 1)
                s = s * torch.exp(g)
            vt = v[:, i]
            if beta is not None:
                vt = beta[:, i].reshape(b, -1, 1) * (vt - torch.einsum("bhdm,bhd->bhm", s, k[:, i]))
            s = s + k[:, i, :, :, None] * vt[:, :, None, :]
            o = torch.einsum("bhd,bhdm->bhm", q[:, i], s.repeat_interleave(hq // hk, 1))
            outs.append(o.reshape(b, 1, hq * dv) * sc)
        return torch.cat(outs, 1), s
    return fn


LINEAR = [  # rule, hq, hk, T, decay width (per key dim: True), beta width (kv heads: True), past, scale
    ("linear", 2, 2, 3, None, None, False, None),
    ("gated", 2, 2, 3, True, None, True, None),
    ("delta", 4, 2, 3, None, True, False, 0.5),
    ("gated_delta", 4, 2, 3, False, False, True, None),
    ("gated_delta", 2, 1, 1, True, True, True, None),
]


@pytest.mark.parametrize("rule,hq,hk,t,per_key,per_head,past,scale", LINEAR,
                         ids=[f"{c[0]}-{c[1]}q{c[2]}kv-t{c[3]}" for c in LINEAR])
def test_linear_attention_against_torch(rule, hq, hk, t, per_key, per_head, past, scale, run_on_gpu):
    dk, dv, b = 4, 3, 2
    key = _f(R, b, t, hk * dk)
    key = (key.reshape(b, t, hk, dk) / np.linalg.norm(key.reshape(b, t, hk, dk), axis=-1, keepdims=True)).reshape(
        b, t, hk * dk).astype(np.float32).astype(np.float64)
    feed = {"query": _f(R, b, t, hq * dk), "key": key, "value": _f(R, b, t, hk * dv)}
    order = ["query", "key", "value", "", "", ""]
    if past:
        feed["past_state"], order[3] = _f(R, b, hk, dk, dv, scale=0.5), "past_state"
    if per_key is not None:
        feed["decay"], order[4] = _f(R, b, t, hk * dk if per_key else hk, scale=0.3) - 0.3, "decay"
    if per_head is not None:
        feed["beta"], order[5] = R.uniform(0.2, 0.9, (b, t, hk if per_head else 1)).astype(np.float32) \
            .astype(np.float64), "beta"
    attrs = {"q_num_heads": hq, "kv_num_heads": hk, "update_rule": rule, **({"scale": scale} if scale else {})}
    model = _model("LinearAttention", feed, order, ["output", "present_state"], attrs)
    fn = _linear_attention(rule, hq, hk, scale, past)
    _check(model, feed, fn, run_on_gpu if rule == "gated_delta" and t > 1 else None)


# ---------------------------------------------------------- CausalConvWithState
@pytest.mark.parametrize("bias,past,act", [(True, True, "silu"), (False, False, "none")])
def test_causal_conv_with_state_against_torch(bias, past, act, run_on_gpu):
    b, c, n, taps = 2, 3, 5, 4
    feed = {"input": _f(R, b, c, n), "weight": _f(R, c, 1, taps)}
    order = ["input", "weight", "", ""]
    if bias:
        feed["bias"], order[2] = _f(R, c), "bias"
    if past:
        feed["past_state"], order[3] = _f(R, b, c, taps - 1), "past_state"
    model = _model("CausalConvWithState", feed, order, ["output", "present_state"], {"activation": act})

    def fn(input, weight, bias=None, past_state=None):
        pad = past_state if past_state is not None else torch.zeros(b, c, taps - 1, dtype=torch.float64)
        seq = torch.cat([pad, input], 2)
        y = F.conv1d(seq, weight, bias, groups=c)
        return (F.silu(y) if act == "silu" else y), seq[:, :, -(taps - 1):]
    _check(model, feed, fn, run_on_gpu if past else None)


def test_causal_conv_present_state_of_a_short_input():
    """Input shorter than k - 1: the state keeps zeros (or past values) in front."""
    feed = {"input": _f(R, 1, 2, 2), "weight": _f(R, 2, 1, 5)}
    model = _model("CausalConvWithState", feed, ["input", "weight"], ["output", "present_state"], {})
    g = load_onnx(model).graph
    got = run_graph(g, feed, np.float64)[0]
    want = ReferenceEvaluator(model).run(None, {k: v.astype(np.float32) for k, v in feed.items()})
    assert _rel(got["output"], want[0]) < 1e-6 and _rel(got["present_state"], want[1]) < 1e-6


def test_unsupported_cases_say_why():
    feed = {"query": _f(R, 1, 2, 4), "key": _f(R, 1, 2, 4), "value": _f(R, 1, 2, 4)}
    model = _model("LinearAttention", feed, ["query", "key", "value"], ["output", "present_state"],
                   {"q_num_heads": 1, "kv_num_heads": 1, "update_rule": "other"})
    with pytest.raises(NotImplementedError, match="update_rule 'other'"):
        load_onnx(model)
    feed = {"Q": _f(R, 1, 2, 4)}
    model = _model("NoSuchOp", feed, ["Q"], ["Y"], {}, domain="ai.onnx.preview")
    with pytest.raises(NotImplementedError, match="ai.onnx.preview::NoSuchOp"):
        load_onnx(model)


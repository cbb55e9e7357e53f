"""Graph builders for the attention family: Attention (opset 23+), FlexAttention
(ai.onnx.preview), LinearAttention and CausalConvWithState (opset 27), each decomposed
into matmul, softmax, masks, slices and elementwise ops (or one `attention` node)."""
from __future__ import annotations

import numpy as np

from ..ir.builder import Tensor
from .common import Known

_NEG_INF = float("-inf")
# LinearAttention's recurrence is unrolled one token at a time: longer inputs make graphs
# too large to schedule in reasonable time
MAX_RECURRENT_STEPS = 1024


# -------------------------------------------------------------------- attention
def _heads(im, t, heads):
    """[B, S, heads * D] -> [B, heads, S, D]."""
    bs, s, hidden = t.shape
    return im.b.transpose(im.b.reshape(t, (bs, s, heads, hidden // heads)), (0, 2, 1, 3))


def _window_bias(at, s, t, offset):
    """The constant part of the additive mask: causal and sliding-window, 0 / -inf."""
    i, j = np.arange(s)[:, None], np.arange(t)[None, :]
    allowed = np.ones((s, t), bool)
    if at.get("is_causal", 0):
        allowed &= j <= i + offset
    left, right = int(at.get("left_window_size", -1)), int(at.get("right_window_size", -1))
    if left >= 0:
        allowed &= (i + offset) - j <= left
    if right >= 0:
        allowed &= j - (i + offset) <= right
    return None if allowed.all() else np.where(allowed, 0.0, _NEG_INF)


def _nonpad_bias(im, name, at, s, t):
    """The additive mask [B, 1, S, T] of an external key-value cache holding nonpad[b]
    valid keys: the keys from nonpad[b] on are padding, and the causal and window bounds
    place query i at position nonpad[b] - S + i. Computed at run time from the lengths."""
    b = im.b
    n = im.tensor(name)
    n = b.reshape(n if n.dtype == "i32" else b.op("cast", n, to="i32"), (n.shape[0], 1, 1, 1))
    i, j = np.arange(s)[:, None], np.arange(t)[None, :]
    rel = j - i + s  # with p = nonpad[b] - S + i: j <= p + r  iff  nonpad[b] >= rel - r

    def above(bound):  # 1 where nonpad[b] > bound[i, j]
        return b.op("greater", n, b.constant_ids(np.broadcast_to(bound, (s, t)).astype(np.int32)))

    allowed = above(j)  # j < nonpad[b]
    if at.get("is_causal", 0):
        allowed = allowed * above(rel - 1)  # j <= p
    left, right = int(at.get("left_window_size", -1)), int(at.get("right_window_size", -1))
    if left >= 0:
        allowed = allowed * (1.0 - above(rel + left))  # p - j <= left
    if right >= 0:
        allowed = allowed * above(rel - right - 1)  # j - p <= right
    return b.op("where", allowed, 0.0, _NEG_INF)


def _attention_qkv(im, ins, at):
    """Q, K, V as [B, heads, S, D] with the past keys and values in front; the past length."""
    b = im.b
    q, k, v = (im.tensor(n) for n in ins[:3])
    if len(q.shape) == 3:
        q, k, v = _heads(im, q, int(at["q_num_heads"])), *(_heads(im, x, int(at["kv_num_heads"])) for x in (k, v))
    past = 0
    if len(ins) > 4 and ins[4]:
        past = im.tensor(ins[4]).shape[2]
        k = b.concat(im.tensor(ins[4]), k, axis=2)
        v = b.concat(im.tensor(ins[5]), v, axis=2)
    return q, k, v, past


def _attention_mask(im, ins, t):
    """The attn_mask input as an additive float mask over all T keys, or None."""
    b = im.b
    if not (len(ins) > 3 and ins[3]):
        return None
    m = im.tensor(ins[3])
    if m.id in im.masks or m.dtype == "i32":
        m = b.op("where", im.mask_of(ins[3]), 0.0, _NEG_INF)
    if m.shape[-1] < t:  # a short mask: the missing keys are masked
        rank_m = len(m.shape)
        m = b.pad(m, starts=(0,) * rank_m, steps=(1,) * rank_m, shape=m.shape[:-1] + (t,), value=_NEG_INF)
    return m


def _b_attention(im, ins, at):
    """ONNX Attention (opset 23+): GQA heads, a bool or additive mask, causal
    (top-left aligned, or after the past keys, or after an external cache's nonpad_kv_seqlen
    valid keys), past/present key-value cache, softcap, and the qk_matmul_output modes;
    fully masked rows give 0, as ONNX says. The plain case (no softcap, no extra outputs,
    nothing fully masked) is one `attention` node."""
    b = im.b
    nonpad = ins[6] if len(ins) > 6 and ins[6] else ""
    q, k, v, past = _attention_qkv(im, ins, at)
    rank = len(im.tensor(ins[0]).shape)
    bs, hq, s, d = q.shape
    t = k.shape[2]
    scale = float(at["scale"]) if "scale" in at else 1.0 / float(np.sqrt(d))
    mask = _attention_mask(im, ins, t)
    if nonpad:  # the causal and window bounds depend on the lengths: all of it at run time
        const = None
        runtime = _nonpad_bias(im, nonpad, at, s, t)
        mask = runtime if mask is None else mask + runtime
    else:
        const = _window_bias(at, s, t, past)  # causal: key j <= past + query i
    softcap = float(at.get("softcap", 0.0) or 0.0)
    want_qk = len(im.node.output) > 3 and im.node.output[3]
    full_rows = mask is not None or (const is not None and np.isneginf(const).all(axis=-1).any())
    outs = [None] * 4
    if not (softcap > 0 or want_qk or full_rows):
        bias = [b.constant(const)] if const is not None else []
        y = b.attention(q, k, v, *bias, scale=scale)
    else:
        bias = mask
        if const is not None:
            bias = b.constant(const) if bias is None else bias + b.constant(const)
        y, outs[3] = _explicit_attention(im, q, k, v, bias, scale, softcap, int(at.get("qk_matmul_output_mode", 0)))
    if rank == 3:
        y = b.reshape(b.transpose(y, (0, 2, 1, 3)), (bs, s, hq * v.shape[3]))
    outs[:3] = [y, k, v]
    return outs


def _explicit_attention(im, q, k, v, bias, scale, softcap, mode):
    """softmax(softcap(Q K^T * scale) + bias) V with the scores and probabilities as graph
    values: (Y, the qk_matmul_output of `mode`). Rows whose bias is all -inf give 0."""
    b = im.b
    bs, hq, s, d = q.shape
    hk, t = k.shape[1], k.shape[2]
    rep = hq // hk
    qg = b.reshape(q, (bs, hk, rep * s, d))
    scores = b.reshape(b.matmul(qg, k, trans_b=True) * scale, (bs, hq, s, t))
    if softcap > 0:
        scores = b.tanh(scores * (1.0 / softcap)) * softcap
    qk = scores
    if bias is not None:
        scores = scores + bias
    if mode == 2:
        qk = scores
    p = b.softmax(scores, -1)
    if bias is not None:  # a row whose bias is all -inf attends to nothing: 0
        dead = b.op("eq", b.max(bias, [len(bias.shape) - 1], True), _NEG_INF)
        p = b.op("where", dead, 0.0, p)
    if mode == 3:
        qk = p
    y = b.reshape(b.matmul(b.reshape(p, (bs, hk, rep * s, t)), v), (bs, hq, s, v.shape[3]))
    return y, qk


# ---------------------------------------------------------------- FlexAttention
def _inline_modifier(im, graph, value: Tensor, tag) -> Tensor:
    """A score_mod / prob_mod subgraph imported inline on `value`: its one output."""
    from onnx import numpy_helper

    if len(graph.input) != 1 or len(graph.output) != 1:
        raise NotImplementedError(f"node {im.label!r}: FlexAttention's {tag} must have one input and one output")
    saved = im.env, im.label, im.node
    im.env = dict(im.env)
    try:
        for init in graph.initializer:
            im.env[init.name] = Known(numpy_helper.to_array(init), f"{tag}/{init.name}")
        im.env[graph.input[0].name] = value
        for node in graph.node:
            im.import_node(node)
            for name in node.output:  # the body's constants are named after the node using them
                v = im.env.get(name)
                if isinstance(v, Known) and v.kind == "const" and v.tensor is None:
                    im.env[name] = Known(v.value, f"{tag}/{name}")
        out = im.tensor(graph.output[0].name)
    finally:
        im.env, im.label, im.node = saved
    if out.shape != value.shape:
        out = im.b.op("broadcast_to", out, shape=value.shape)
    return out if out.dtype == "f32" else im.b.op("cast", out, to="f32")


def _b_flex_attention(im, ins, at):
    """ai.onnx.preview FlexAttention: softmax(score_mod(Q K^T * scale)), then prob_mod,
    times V; GQA heads share K and V in contiguous groups. Without modifiers it is one
    `attention` node."""
    b = im.b
    q, k, v = (im.tensor(n) for n in ins[:3])
    if any(len(x.shape) != 4 for x in (q, k, v)):
        raise NotImplementedError(f"node {im.label!r}: FlexAttention takes rank-4 Q, K and V")
    bs, hq, s, d = q.shape
    hk, t = k.shape[1], k.shape[2]
    scale = float(at["scale"]) if "scale" in at else 1.0 / float(np.sqrt(d))
    score_mod, prob_mod = at.get("score_mod"), at.get("prob_mod")
    if score_mod is None and prob_mod is None:
        return b.attention(q, k, v, scale=scale)
    rep = hq // hk
    scores = b.reshape(b.matmul(b.reshape(q, (bs, hk, rep * s, d)), k, trans_b=True) * scale, (bs, hq, s, t))
    tag = im.node.output[0]
    if score_mod is not None:
        scores = _inline_modifier(im, score_mod, scores, f"{tag}/score_mod")
    p = b.softmax(scores, -1)
    if prob_mod is not None:
        p = _inline_modifier(im, prob_mod, p, f"{tag}/prob_mod")
    return b.reshape(b.matmul(b.reshape(p, (bs, hk, rep * s, t)), v), (bs, hq, s, v.shape[3]))


# --------------------------------------------------------------- LinearAttention
def _per_step(im, x, heads, inner):
    """[B, T, heads * inner] (or [B, T, 1]) -> [B, T, heads, inner, 1]: one slice per token."""
    bs, steps, width = x.shape
    return im.b.reshape(x, (bs, steps, width // inner, inner, 1))


def _at_step(im, x, step):
    """Token `step` of a [B, T, ...] tensor, without its T axis."""
    shape = x.shape
    rank = len(shape)
    piece = im.b.slice(x, starts=(0, step) + (0,) * (rank - 2), steps=(1,) * rank, shape=(shape[0], 1) + shape[2:])
    return im.b.reshape(piece, (shape[0],) + shape[2:])


def _b_linear_attention(im, ins, at):
    """ONNX LinearAttention: the recurrence over the tokens, unrolled, on a state
    [B, H_kv, d_k, d_v] (zeros, or past_state). Each token: the state decays by exp(decay)
    (gated rules), the value becomes beta * (v - S^T k) (delta rules), S += k v^T, and the
    output is scale * q^T S, each query head reading the state of its key-value group."""
    b = im.b
    rule = at.get("update_rule", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise NotImplementedError(f"node {im.label!r}: LinearAttention update_rule {rule!r}")
    hq, hk = int(at["q_num_heads"]), int(at["kv_num_heads"])
    q, k, v = (im.tensor(n) for n in ins[:3])
    bs, steps, _ = q.shape
    if steps > MAX_RECURRENT_STEPS:
        raise NotImplementedError(f"node {im.label!r}: LinearAttention over {steps} tokens (at most "
                                  f"{MAX_RECURRENT_STEPS}: the recurrence is unrolled per token)")
    dk, dv, rep = q.shape[2] // hq, v.shape[2] // hk, hq // hk
    scale = float(at.get("scale", 0.0) or 0.0) or 1.0 / float(np.sqrt(dk))
    qs = b.reshape(q, (bs, steps, hk, rep, dk))
    ks, vs = b.reshape(k, (bs, steps, hk, dk, 1)), b.reshape(v, (bs, steps, hk, 1, dv))
    decay = beta = None
    if rule in ("gated", "gated_delta"):
        g = im.tensor(ins[4])
        decay = b.exp(_per_step(im, g, hk, dk if g.shape[2] == hk * dk else 1))
    if rule in ("delta", "gated_delta"):
        beta = _per_step(im, im.tensor(ins[5]), hk, 1)
    state = im.tensor(ins[3]) if len(ins) > 3 and ins[3] else None
    outs = []
    for step in range(steps):
        k_t, v_t = _at_step(im, ks, step), _at_step(im, vs, step)  # [B, H, dk, 1], [B, H, 1, dv]
        if state is not None and decay is not None:
            state = state * _at_step(im, decay, step)
        if beta is not None:
            if state is not None:  # v - S^T k, as a row
                v_t = v_t - b.matmul(b.transpose(k_t, (0, 1, 3, 2)), state)
            v_t = v_t * _at_step(im, beta, step)
        write = k_t * v_t
        state = write if state is None else state + write
        o_t = b.matmul(_at_step(im, qs, step), state) * scale  # [B, H_kv, rep, dv]
        outs.append(b.reshape(o_t, (bs, 1, hq * dv)))
    y = outs[0] if steps == 1 else b.concat(*outs, axis=1)
    return [y, state]


# ----------------------------------------------------------- CausalConvWithState
def _b_causal_conv(im, ins, at):
    """ONNX CausalConvWithState: a depthwise 1-D convolution over [past_state (or zeros),
    input], as k shifted slices times the kernel's taps; optional bias and SiLU; the
    present state is the last k - 1 positions of that sequence."""
    b = im.b
    act = at.get("activation", "none")
    if act not in ("none", "silu", "swish"):
        raise NotImplementedError(f"node {im.label!r}: CausalConvWithState activation {act!r}")
    x, w = im.tensor(ins[0]), im.tensor(ins[1])
    bs, c, n = x.shape
    taps = w.shape[2]
    if len(ins) > 3 and ins[3]:
        seq = b.concat(im.tensor(ins[3]), x, axis=2)
    else:
        seq = b.pad(x, starts=(0, 0, taps - 1), steps=(1, 1, 1), shape=(bs, c, n + taps - 1), value=0.0)
    w = b.reshape(w, (c, taps))
    y = None
    for j in range(taps):
        term = b.slice(seq, starts=(0, 0, j), steps=(1, 1, 1), shape=(bs, c, n)) * \
            b.slice(w, starts=(0, j), steps=(1, 1), shape=(c, 1))
        y = term if y is None else y + term
    if len(ins) > 2 and ins[2]:
        y = y + b.reshape(im.tensor(ins[2]), (c, 1))
    if act != "none":
        y = b.op("silu", y)
    present = None
    if taps > 1:  # (with one tap the state is empty, which meganeura does not hold)
        present = b.slice(seq, starts=(0, 0, n), steps=(1, 1, 1), shape=(bs, c, taps - 1))
    return [y, present]


BUILD_ATTENTION = {
    "Attention": _b_attention,
    "ai.onnx.preview::FlexAttention": _b_flex_attention,
    "LinearAttention": _b_linear_attention,
    "CausalConvWithState": _b_causal_conv,
}

"""Graph builders for recurrent layers (RNN, GRU, LSTM), control flow (If, Loop, Scan)
and the ops whose output shape depends on data.

A compiled program has fixed shapes, so everything here is unrolled at import time:
- RNN / GRU / LSTM over the sequence length, into matmul, sigmoid, tanh, mul, add and
  slices. The input projection of every time step (and both directions) is one matmul;
  each step adds one matmul with the recurrent weights.
- If imports the branch its (known) condition takes; Loop runs its body once per
  iteration of a known trip count; Scan once per element of its scan inputs. A body sees
  the values of the scopes around it; its scan outputs are stacked.
- NonZero, Unique, ... cannot have a fixed output shape: they raise and say so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..ir.builder import Tensor
from .common import Known, as_ints

# --------------------------------------------------------------- activations
_ALPHA = {"affine": 1.0, "leakyrelu": 0.01, "thresholdedrelu": 1.0, "scaledtanh": 1.0, "hardsigmoid": 0.2,
          "elu": 1.0}
_BETA = {"affine": 0.0, "scaledtanh": 1.0, "hardsigmoid": 0.5}


def _clamp(b, x, lo, hi):
    return b.op("maximum", -b.op("maximum", -x, -hi), lo)


def _activation(b, name, alpha, beta):
    """The ONNX recurrent activation `name` as a function of a Tensor."""
    n = name.lower()
    fns = {
        "sigmoid": lambda x: b.sigmoid(x),
        "tanh": lambda x: b.tanh(x),
        "relu": lambda x: b.relu(x),
        "affine": lambda x: x * alpha + beta,
        "leakyrelu": lambda x: b.op("where", b.step(x), x, x * alpha),
        "thresholdedrelu": lambda x: b.op("where", b.step(x - alpha), x, 0.0),
        "scaledtanh": lambda x: b.tanh(x * beta) * alpha,
        "hardsigmoid": lambda x: _clamp(b, x * alpha + beta, 0.0, 1.0),
        "elu": lambda x: b.op("where", b.step(x), x, (b.exp(x) - 1.0) * alpha),
        "softsign": lambda x: x / (b.op("maximum", x, -x) + 1.0),
        "softplus": lambda x: b.softplus(x),
    }
    if n not in fns:
        raise NotImplementedError(f"recurrent activation {name!r} is not supported")
    return fns[n]


def _activations(im, at, defaults, dirs):
    """Per direction, the list of activation functions (alpha / beta taken in order by
    the functions that use them)."""
    names = [a.decode() if isinstance(a, bytes) else str(a) for a in at.get("activations", [])]
    names = names or defaults * dirs
    if len(names) != len(defaults) * dirs:
        raise ValueError(f"node {im.label!r}: {len(names)} activations, expected {len(defaults) * dirs}")
    alphas, betas = list(at.get("activation_alpha", [])), list(at.get("activation_beta", []))
    fns = []
    for n in names:
        key = n.lower()
        alpha = float(alphas.pop(0)) if key in _ALPHA and alphas else _ALPHA.get(key, 0.0)
        beta = float(betas.pop(0)) if key in _BETA and betas else _BETA.get(key, 0.0)
        fns.append(_activation(im.b, n, alpha, beta))
    k = len(defaults)
    return [fns[d * k:(d + 1) * k] for d in range(dirs)]


# ------------------------------------------------------------ recurrent layers
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


@dataclass
class _Rnn:
    """A recurrent layer's inputs, time-major: x [T, B, I]; per direction d the
    projected inputs xw [T, B, D * G * H] hold x @ W_d.T plus the biases that add there."""
    kind: str
    hidden: int
    dirs: list
    x: Tensor
    lens: np.ndarray | None
    acts: list
    clip: float | None
    at: dict
    xw: Tensor | None = None
    rec: list = field(default_factory=list)  # per direction: R_d [G * H, H]
    rbias: list = field(default_factory=list)  # per direction: GRU's R_bh [H] (linear_before_reset), or None
    h0: list = field(default_factory=list)
    c0: list = field(default_factory=list)
    peep: list = field(default_factory=list)  # per direction: (P_i, P_o, P_f) [H] each, or None


def _per_direction(im, name, layout, dirs):
    """An optional [D, B, H] input ([B, D, H] in layout 1) as D tensors [B, H], or Nones."""
    if not name:
        return [None] * dirs
    t = im.tensor(name)
    if layout:
        t = im.b.transpose(t, (1, 0, 2))
    _, bs, h = t.shape
    return [im.b.reshape(_take(im.b, t, 0, d), (bs, h)) for d in range(dirs)]


def _take(b, t, axis, i, size=1):
    """t[..., i:i + size, ...] along `axis`."""
    starts = tuple(i if a == axis else 0 for a in range(len(t.shape)))
    shape = tuple(size if a == axis else d for a, d in enumerate(t.shape))
    return b.slice(t, starts=starts, steps=(1,) * len(t.shape), shape=shape)


def _parse_rnn(im, ins, at, kind):
    b = im.b
    ins = list(ins) + [""] * (8 - len(ins))
    x = im.tensor(ins[0])
    layout = int(at.get("layout", 0))
    if layout:
        x = b.transpose(x, (1, 0, 2))
    steps, bs, _ = x.shape
    direction = at.get("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ValueError(f"node {im.label!r}: direction {direction!r}")
    dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    lens = None
    if ins[4]:
        lens = np.asarray(im.known(ins[4], "sequence_lens"), np.int64).reshape(-1)
        if (lens == steps).all():
            lens = None
        elif lens.shape != (bs,) or (lens < 0).any() or (lens > steps).any():
            raise ValueError(f"node {im.label!r}: sequence_lens {lens.tolist()} for {bs} sequences of {steps}")
    clip = float(at["clip"]) if "clip" in at else None
    s = _Rnn(kind, int(at["hidden_size"]), dirs, x, lens, _activations(im, at, _DEFAULT_ACTS[kind], len(dirs)),
             clip, at)
    s.h0 = _per_direction(im, ins[5], layout, len(dirs))
    s.c0 = _per_direction(im, ins[6], layout, len(dirs)) if kind == "LSTM" else [None] * len(dirs)
    _project(im, s, ins[1], ins[2], ins[3])
    s.peep = [None] * len(dirs)
    if kind == "LSTM" and ins[7]:
        p = im.tensor(ins[7])
        h = s.hidden
        s.peep = [tuple(b.reshape(b.slice(p, starts=(d, k * h), steps=(1, 1), shape=(1, h)), (h,))
                        for k in range(3)) for d in range(len(dirs))]
    return s


def _project(im, s, w_name, r_name, b_name):
    """x @ W.T for every step and direction in one matmul, plus the input-side biases."""
    b, h, dirs = im.b, s.hidden, len(s.dirs)
    gh = _GATES[s.kind] * h
    steps, bs, size = s.x.shape
    w = b.reshape(_weight(im, s, w_name, ("weight_ih",)), (dirs * gh, size))
    xw = b.matmul(b.reshape(s.x, (steps * bs, size)), w, trans_b=True)
    r = _weight(im, s, r_name, ("weight_hh",))
    s.rec = [b.reshape(_take(b, r, 0, d), (gh, h)) for d in range(dirs)]
    s.rbias = [None] * dirs
    if b_name:
        bias = _weight(im, s, b_name, ("bias_ih", "bias_hh"))  # [D, 2 * G * H]: W's biases, then R's
        wb, rb = _take(b, bias, 1, 0, gh), _take(b, bias, 1, gh, gh)
        lbr = s.kind == "GRU" and int(s.at.get("linear_before_reset", 0))
        if lbr:  # R_bh is added inside r * (h @ R_h.T + R_bh): only R_bz, R_br add here
            s.rbias = [b.reshape(_take(b, rb, 0, d), (gh,)) for d in range(dirs)]
            s.rbias = [_take(b, v, 0, 2 * h, h) for v in s.rbias]
            rb = _take(b, rb, 1, 0, 2 * h)
            rb = b.pad(rb, starts=(0, 0), steps=(1, 1), shape=(dirs, gh), value=0.0)
        xw = xw + b.reshape(wb + rb, (dirs * gh,))
    s.xw = b.reshape(xw, (steps, bs, dirs * gh))


# ONNX's gate k is torch's gate _TORCH_GATES[kind][k]: LSTM (i, f, g, o) -> (i, o, f, c), GRU (r, z, n) -> (z, r, h)
_TORCH_GATES = {"LSTM": (0, 3, 1, 2), "GRU": (1, 0, 2), "RNN": (0,)}
_TORCH_NAME = re.compile(r"\.(weight_ih|weight_hh|bias_ih|bias_hh)_l\d+(_reverse)?$")


def _weight(im, s, name, roles):
    """A recurrent layer's W, R ([D, G * H, n]) or B ([D, 2 * G * H]). Where the dynamo exporter
    folded it from torch's parameters (`weight_ih_l0`, ...), it is built from those, in torch's
    layout and gate order and under torch's names, so that they train and save as torch's do."""
    found = getattr(im, "rnn_sources", {}).get(name)
    parts = _torch_parts(found[1], roles, s.dirs) if found else None
    value = im.known(name) if parts else None
    gh = _GATES[s.kind] * s.hidden
    if parts is None or value.shape[0] != len(s.dirs) or value[0].size % (len(roles) * gh):
        return im.tensor(name)
    b, h, order = im.b, s.hidden, _TORCH_GATES[s.kind]
    rows = []
    for d, names in enumerate(parts):
        blocks = value[d].reshape((len(roles), gh) + value.shape[2:])
        pieces = []
        for pname, block in zip(names, blocks):
            torch_value = np.empty_like(block)
            for k, t in enumerate(order):
                torch_value[t * h:(t + 1) * h] = block[k * h:(k + 1) * h]
            im.env.setdefault(f"{pname}#torch", Known(torch_value, pname, "param"))
            p = im.tensor(f"{pname}#torch")
            pieces += [_take(b, p, 0, t * h, h) for t in order]
        rows.append(b.reshape(b.concat(*pieces, axis=0), (1,) + value.shape[1:]))
    return b.concat(*rows, axis=0) if len(rows) > 1 else rows[0]


def _torch_parts(sources, roles, dirs):
    """Per direction, the torch parameter of each role (forward: `_l0`, reverse: `_l0_reverse`),
    or None unless each is there exactly once."""
    found = {}
    for src in sources:
        m = _TORCH_NAME.search(src)
        if m is None or (m.group(1), bool(m.group(2))) in found:
            return None
        found[(m.group(1), bool(m.group(2)))] = src
    parts = [[found.get((r, d == "reverse")) for r in roles] for d in dirs]
    if any(None in p for p in parts) or sum(map(len, parts)) != len(found):
        return None
    return parts


def _gate(b, t, k, h):
    """Gate k ([B, H]) of a [B, G * H] tensor."""
    return _take(b, t, 1, k * h, h)


def _pre(b, s, v):
    """A gate's pre-activation, clipped to [-clip, clip] when the layer has a clip."""
    return v if s.clip is None else _clamp(b, v, -s.clip, s.clip)


def _step(im, s, d, t, h, c):
    """One time step of direction d: (new h, new c)."""
    b, hs = im.b, s.hidden
    bs = s.xw.shape[1]
    gh = _GATES[s.kind] * hs
    xg = b.reshape(_take(b, _take(b, s.xw, 0, t), 2, d * gh, gh), (bs, gh))
    acts = s.acts[d]
    if s.kind == "RNN":
        pre = xg if h is None else xg + b.matmul(h, s.rec[d], trans_b=True)
        return acts[0](_pre(b, s, pre)), None
    if s.kind == "GRU":
        return _gru_step(b, s, d, xg, h, acts), None
    hr = None if h is None else b.matmul(h, s.rec[d], trans_b=True)
    g = [_gate(b, xg, k, hs) if hr is None else _gate(b, xg, k, hs) + _gate(b, hr, k, hs) for k in range(4)]
    p = s.peep[d]
    if p is not None and c is not None:
        g[0], g[2] = g[0] + p[0] * c, g[2] + p[2] * c
    i = acts[0](_pre(b, s, g[0]))
    f = 1.0 - i if int(s.at.get("input_forget", 0)) else acts[0](_pre(b, s, g[2]))
    cell = i * acts[1](_pre(b, s, g[3]))
    if c is not None:
        cell = f * c + cell
    o_pre = g[1] if p is None else g[1] + p[1] * cell
    return acts[0](_pre(b, s, o_pre)) * acts[2](cell), cell


def _gru_step(b, s, d, xg, h, acts):
    hs = s.hidden
    lbr = int(s.at.get("linear_before_reset", 0))
    r_all = s.rec[d]
    if h is None:
        hr = None
    elif lbr:
        hr = b.matmul(h, r_all, trans_b=True)
    else:
        hr = b.matmul(h, _take(b, r_all, 0, 0, 2 * hs), trans_b=True)
    z_pre, r_pre = (_gate(b, xg, k, hs) if hr is None else _gate(b, xg, k, hs) + _gate(b, hr, k, hs) for k in (0, 1))
    z, r = acts[0](_pre(b, s, z_pre)), acts[0](_pre(b, s, r_pre))
    n_pre = _gate(b, xg, 2, hs)
    if lbr:
        inner = s.rbias[d] if hr is None else (_gate(b, hr, 2, hs) if s.rbias[d] is None else
                                                _gate(b, hr, 2, hs) + s.rbias[d])
        if inner is not None:
            n_pre = n_pre + r * inner
    elif h is not None:
        n_pre = n_pre + b.matmul(r * h, _take(b, r_all, 0, 2 * hs, hs), trans_b=True)
    n = acts[1](_pre(b, s, n_pre))
    return n - z * n if h is None else n + z * (h - n)


def _run_direction(im, s, d):
    """All steps of direction d: ([h of each time step, time order], last h, last c)."""
    b = im.b
    steps = s.x.shape[0]
    order = range(steps) if s.dirs[d] == "forward" else range(steps - 1, -1, -1)
    h, c = s.h0[d], s.c0[d]
    ys = [None] * steps
    for t in order:
        nh, nc = _step(im, s, d, t, h, c)
        if s.lens is not None:  # past a sequence's end its state is held and its output is 0
            live = b.constant((t < s.lens).astype(np.float64).reshape(-1, 1))
            ys[t] = b.op("where", live, nh, 0.0)
            nh = b.op("where", live, nh, 0.0 if h is None else h)
            if nc is not None:
                nc = b.op("where", live, nc, 0.0 if c is None else c)
        else:
            ys[t] = nh
        h, c = nh, nc
    return ys, h, c


def _b_recurrent(kind):
    def build(im, ins, at):
        b = im.b
        s = _parse_rnn(im, ins, at, kind)
        steps, bs, _ = s.x.shape
        hs, dirs = s.hidden, len(s.dirs)
        runs = [_run_direction(im, s, d) for d in range(dirs)]
        want = list(im.node.output) + [""] * 3
        layout = int(at.get("layout", 0))
        outs = [None, None, None]
        if want[0]:
            pieces = [b.reshape(runs[d][0][t], (1, bs, hs)) for t in range(steps) for d in range(dirs)]
            y = b.reshape(b.concat(*pieces, axis=0) if len(pieces) > 1 else pieces[0], (steps, dirs, bs, hs))
            outs[0] = b.transpose(y, (2, 0, 1, 3)) if layout else y
        for k in (1, 2):  # Y_h, Y_c: the last state of each direction
            if not want[k] or (k == 2 and kind != "LSTM"):
                continue
            finals = [b.reshape(run[k], (1, bs, hs)) for run in runs]
            y = b.concat(*finals, axis=0) if dirs > 1 else finals[0]
            outs[k] = b.transpose(y, (1, 0, 2)) if layout else y
        return outs
    return build


# ------------------------------------------------------------------ subgraphs
def _run_body(im, graph, values, tag):
    """Import a subgraph's nodes inline with its inputs bound to `values`; outer-scope
    values stay visible, the body's own names are dropped afterwards. Constants made in
    the body are named after `tag`, so that each unrolled iteration gets its own."""
    from onnx import numpy_helper

    saved = im.env, im.label, im.node
    im.env = dict(im.env)
    try:
        for init in graph.initializer:
            im.env[init.name] = Known(numpy_helper.to_array(init), f"{tag}/{init.name}")
        for vi, v in zip(graph.input, values):
            im.env[vi.name] = v
        for node in graph.node:
            im.import_node(node)
            for name in node.output:
                v = im.env.get(name)
                if isinstance(v, Known) and v.kind == "const" and v.tensor is None:
                    im.env[name] = Known(v.value, f"{tag}/{name}")
        return [im.env[vi.name] for vi in graph.output]
    finally:
        im.env, im.label, im.node = saved


def _b_if(im, ins, at):
    cond = np.asarray(im.known(ins[0], "the condition"))
    if cond.size != 1:
        raise ValueError(f"node {im.label!r}: If's condition has {cond.size} elements")
    branch = at["then_branch"] if bool(cond.reshape(())) else at["else_branch"]
    return _run_body(im, branch, [], im.label)


def _stack(im, values, axis=0):
    """Stack scan outputs along a new axis."""
    if all(isinstance(v, Known) for v in values):
        return np.stack([np.asarray(v.value) for v in values], axis=axis)
    b = im.b
    ts = [_as_tensor(im, v) for v in values]
    shape = ts[0].shape
    axis = axis % (len(shape) + 1)
    pieces = [b.reshape(t, shape[:axis] + (1,) + shape[axis:]) for t in ts]
    return b.concat(*pieces, axis=axis) if len(pieces) > 1 else pieces[0]


def _as_tensor(im, v):
    if isinstance(v, Tensor):
        return v
    im.env[f"{v.name}#tensor"] = v
    return im.tensor(f"{v.name}#tensor")


def _b_loop(im, ins, at):
    """Loop with a trip count and/or condition known at import time, unrolled."""
    ins = list(ins) + [""] * (2 - len(ins))
    trips = int(np.asarray(im.known(ins[0], "the trip count")).reshape(())) if ins[0] else None
    cond = bool(np.asarray(im.known(ins[1], "the condition")).reshape(())) if ins[1] else True
    body = at["body"]
    carried = [im.env[n] for n in ins[2:]]
    scans = []
    i = 0
    while cond and (trips is None or i < trips):
        if trips is None and i >= 65536:
            raise NotImplementedError(f"node {im.label!r}: Loop without a trip count ran 65536 iterations")
        it = [Known(np.array(i, np.int64), "iter"), Known(np.array(cond), "cond")]
        outs = _run_body(im, body, it + carried, f"{im.label}.{i}")
        c = outs[0]
        if not isinstance(c, Known):
            raise NotImplementedError(f"node {im.label!r}: Loop whose condition is computed from tensors "
                                      "(a data-dependent trip count) cannot be unrolled")
        cond = bool(np.asarray(c.value).reshape(()))
        carried = outs[1:1 + len(carried)]
        scans.append(outs[1 + len(carried):])
        i += 1
    n_scan = len(body.output) - 1 - len(carried)
    if n_scan and not scans:
        raise NotImplementedError(f"node {im.label!r}: Loop with zero iterations has empty scan outputs")
    return carried + [_stack(im, [s[k] for s in scans]) for k in range(n_scan)]


def _slice_value(im, v, axis, i):
    """Element i along `axis` of a value, that axis dropped."""
    if isinstance(v, Known):
        return Known(np.take(v.value, i, axis=axis), v.name)
    t = _take(im.b, v, axis, i)
    return im.b.reshape(t, v.shape[:axis] + v.shape[axis + 1:])


def _scan(im, at, states, xs, tag):
    """One Scan (opset 9 semantics) over values `xs`: (final states, scan outputs)."""
    body = at["body"]
    k = len(xs)
    in_axes = as_ints(at.get("scan_input_axes", [0] * k))
    in_dirs = as_ints(at.get("scan_input_directions", at.get("directions", [0] * k)))
    shapes = [v.value.shape if isinstance(v, Known) else v.shape for v in xs]
    in_axes = [a % len(s) for a, s in zip(in_axes, shapes)]
    lengths = {s[a] for a, s in zip(in_axes, shapes)}
    if len(lengths) != 1:
        raise ValueError(f"node {im.label!r}: scan inputs of different lengths {sorted(lengths)}")
    steps = lengths.pop()
    outs = []
    for t in range(steps):
        elems = [_slice_value(im, v, a, steps - 1 - t if dr else t) for v, a, dr in zip(xs, in_axes, in_dirs)]
        res = _run_body(im, body, list(states) + elems, f"{tag}.{t}")
        states, per_step = res[:len(states)], res[len(states):]
        outs.append(per_step)
    n_out = len(body.output) - len(states)
    out_axes = as_ints(at.get("scan_output_axes", [0] * n_out))
    out_dirs = as_ints(at.get("scan_output_directions", [0] * n_out))
    if not outs and n_out:
        raise NotImplementedError(f"node {im.label!r}: Scan over zero steps has empty scan outputs")
    scans = []
    for j in range(n_out):
        seq = [o[j] for o in outs]
        scans.append(_stack(im, seq[::-1] if out_dirs[j] else seq, out_axes[j]))
    return list(states), scans


def _b_scan(im, ins, at):
    k = int(at["num_scan_inputs"])
    if im.opset >= 9:
        states = [im.env[n] for n in ins[:len(ins) - k]]
        xs = [im.env[n] for n in ins[len(ins) - k:]]
        finals, scans = _scan(im, at, states, xs, im.label)
        return [_value(v) for v in finals] + scans
    # opset 8: a batch axis in front of everything, optional sequence_lens first
    if ins[0]:
        lens = np.asarray(im.known(ins[0], "sequence_lens")).reshape(-1)
        full = {(v.value.shape if isinstance(v, Known) else v.shape)[1] for v in (im.env[n] for n in ins[-k:])}
        if len(full) != 1 or (lens != full.pop()).any():
            raise NotImplementedError(f"node {im.label!r}: Scan with sequences shorter than their inputs")
    states = [im.env[n] for n in ins[1:len(ins) - k]]
    xs = [im.env[n] for n in ins[len(ins) - k:]]
    batch = (xs[0].value.shape if isinstance(xs[0], Known) else xs[0].shape)[0]
    at8 = {**at, "scan_input_axes": [0] * k}
    per = [_scan(im, at8, [_slice_value(im, v, 0, i) for v in states], [_slice_value(im, v, 0, i) for v in xs],
                 f"{im.label}.{i}") for i in range(batch)]
    finals = [_stack(im, [p[0][j] for p in per]) for j in range(len(states))]
    scans = [_stack(im, [p[1][j] for p in per]) for j in range(len(per[0][1]))]
    return finals + scans


def _value(v):
    return v.value if isinstance(v, Known) else v


# ------------------------------------------------------ data-dependent shapes
def _b_range(im, ins, at):
    """Range whose bounds are known (e.g. float initializers); its length depends on them."""
    vals = [np.asarray(im.known(n, "Range's bounds (its length depends on them)")) for n in ins[:3]]
    return np.arange(vals[0], vals[1], vals[2]).astype(vals[0].dtype)


def _data_dependent(op, why):
    def build(im, ins, at):
        raise NotImplementedError(f"ONNX op {op} (node {im.label!r}) cannot compile for fixed shapes: {why}")
    return build


BUILD_SEQ = {
    "RNN": _b_recurrent("RNN"),
    "GRU": _b_recurrent("GRU"),
    "LSTM": _b_recurrent("LSTM"),
    "If": _b_if,
    "Loop": _b_loop,
    "Scan": _b_scan,
    "Range": _b_range,
    "NonZero": _data_dependent("NonZero", "its output length is the number of nonzero elements"),
    "Unique": _data_dependent("Unique", "its output length is the number of distinct elements"),
    "NonMaxSuppression": _data_dependent("NonMaxSuppression", "the number of boxes it keeps depends on the scores"),
}

# inputs read as constants (their values, not tensors); control flow passes any dtype through, and
# the data-dependent ops refuse any dtype with their own reason
SEQ_PARAM_INPUTS = {"RNN": (4,), "GRU": (4,), "LSTM": (4,), "Loop": (0, 1), "If": (0,), "Range": (0, 1, 2)}
SEQ_INT_OK = frozenset({"Loop", "Scan", "If", "NonZero", "Unique", "NonMaxSuppression"})

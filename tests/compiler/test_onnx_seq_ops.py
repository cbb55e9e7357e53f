"""ONNX recurrent layers and control flow: torch.nn.LSTM / GRU / RNN exported with both
exporters, and hand-built If / Loop / Scan graphs, imported and run by the float64
interpreter; outputs and the gradients of sum(output * ct) w.r.t. the inputs and
every weight compared on full tensors with torch autograd (float64). On the GPU: an
LSTM model's forward and gradients, and a 3-step training trajectory against torch."""
import copy
import io
import warnings

import numpy as np
import onnx  # (the test extra installs it)
import pytest
import torch
from meganeura.compiler import Builder, compile_graph, compile_model, run_graph
from meganeura.compiler.ir.autodiff import gradients
from meganeura.compiler.ir.training import TrainConfig
from meganeura.compiler.onnx_import import load_onnx
from meganeura.runtime import Package, Session
from onnx import TensorProto, helper, numpy_helper
from torch import nn

# ONNX gate order from torch's: LSTM (i, f, g, o) -> (i, o, f, c); GRU (r, z, n) -> (z, r, h)
GATE_ORDER = {nn.LSTM: [0, 3, 1, 2], nn.GRU: [1, 0, 2], nn.RNN: [0]}


def export(module, args, exporter="torchscript", opset=17):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            f = io.BytesIO()
            torch.onnx.export(module, args, f, dynamo=False, opset_version=opset,
                              input_names=[f"in{i}" for i in range(len(args))])
            return onnx.load_from_string(f.getvalue())
        return torch.onnx.export(module, args, dynamo=True, opset_version=opset, verbose=False).model_proto


def with_gradients(model, cts: dict, wrt_inputs=()):
    """The model's graph with inputs ct.<output> and outputs grad.<name>: the gradients of
    sum over outputs of sum(output * ct) w.r.t. every parameter and the given inputs."""
    b = Builder.extend(model)
    outs = b.outputs
    loss = None
    for name, shape in cts.items():
        term = b.sum(outs[name] * b.input(f"ct.{name}", shape))
        loss = term if loss is None else loss + term
    ids = {**{n: b.g.params[n] for n in model.params if n not in b.g.frozen},
           **{n: b.g.inputs[n] for n in wrt_inputs}}
    grads = gradients(b.e, loss.id, list(ids.values()))
    for n, i in ids.items():
        if i in grads:  # else the outputs do not depend on it (or only through floors)
            b.g.outputs[f"grad.{n}"] = grads[i]
    return b.g


def onnx_layout(module, tensors):
    """torch recurrent weights (or their gradients, `tensors` by parameter name) in ONNX's
    per-layer layout: W [D, G*H, I], R [D, G*H, H], B [D, 2*G*H]."""
    order = GATE_ORDER[type(module)]
    h = module.hidden_size

    def gates(a):
        return np.concatenate([a[k * h:(k + 1) * h] for k in order])

    out = []
    sfx = ["", "_reverse"] if module.bidirectional else [""]
    for layer in range(module.num_layers):
        def get(kind, s, layer=layer):
            return tensors[f"{kind}_l{layer}{s}"]

        out.append(np.stack([gates(get("weight_ih", s)) for s in sfx]))
        out.append(np.stack([gates(get("weight_hh", s)) for s in sfx]))
        out.append(np.stack([np.concatenate([gates(get("bias_ih", s)), gates(get("bias_hh", s))]) for s in sfx]))
    return out


class Recurrent(nn.Module):
    """A recurrent layer, outputs (y, h_n) or (y, h_n, c_n); batch-first input."""

    def __init__(self, layer):
        super().__init__()
        self.rnn = layer

    def forward(self, x, h0):
        if isinstance(self.rnn, nn.LSTM):
            y, (h, c) = self.rnn(x, (h0, h0 * 0.5))
            return y, h, c
        y, h = self.rnn(x, h0)
        return y, h


LAYERS = {
    "lstm_bidirectional_2layers": lambda: nn.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True),
    "gru_bidirectional": lambda: nn.GRU(4, 5, bidirectional=True, batch_first=True),
    "gru": lambda: nn.GRU(3, 6, batch_first=True),
    "rnn_relu_2layers": lambda: nn.RNN(4, 5, num_layers=2, nonlinearity="relu", batch_first=True),
    "rnn_tanh_bidirectional": lambda: nn.RNN(4, 3, bidirectional=True, batch_first=True),
}
CASES = [(name, "torchscript", 17) for name in LAYERS] + [("lstm_bidirectional_2layers", "dynamo", 18),
                                                           ("gru_bidirectional", "dynamo", 18)]


@pytest.mark.parametrize("name,exporter,opset", CASES, ids=[f"{n}-{e}" for n, e, _ in CASES])
def test_torch_recurrent_layers_match_torch_autograd(name, exporter, opset):
    torch.manual_seed(0)
    module = Recurrent(LAYERS[name]()).eval()
    rnn = module.rnn
    batch, steps, layers = 3, 6, rnn.num_layers * (2 if rnn.bidirectional else 1)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, steps, rnn.input_size))
    h0 = rng.standard_normal((layers, batch, rnn.hidden_size)) * 0.5
    proto = export(module, (torch.randn(batch, steps, rnn.input_size), torch.randn(layers, batch, rnn.hidden_size)),
                   exporter, opset)
    model = load_onnx(proto, batch_size=batch)
    names = [vi.name for vi in proto.graph.input]
    ref = copy.deepcopy(module).double()
    tx, th = (torch.tensor(a, requires_grad=True) for a in (x, h0))
    touts = ref(tx, th)
    cts = [rng.standard_normal(t.shape) for t in touts]
    sum(((t * torch.tensor(c)).sum() for t, c in zip(touts, cts))).backward()

    g = with_gradients(model, dict(zip(model.graph.outputs, [c.shape for c in cts])), names)
    feed = {names[0]: x, names[1]: h0, **{f"ct.{k}": c for k, c in zip(model.graph.outputs, cts)}}
    got = run_graph(g, feed, np.float64)[0]
    for k, t in zip(model.graph.outputs, touts):
        np.testing.assert_allclose(got[k], t.detach().numpy(), rtol=1e-9, atol=1e-9, err_msg=k)
    np.testing.assert_allclose(got[f"grad.{names[0]}"], tx.grad.numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got[f"grad.{names[1]}"], th.grad.numpy(), rtol=1e-9, atol=1e-9)
    # every ONNX weight is a reordered torch weight: its gradient is the reordered torch gradient
    # (the dynamo exporter's folded LSTM / GRU weights import as torch's own parameters, torch's layout)
    values = onnx_layout(rnn, {k: v.detach().numpy() for k, v in rnn.named_parameters()})
    grads = onnx_layout(rnn, {k: v.grad.numpy() for k, v in ref.rnn.named_parameters()})
    torch_grads = {f"rnn.{k}": v.grad.numpy() for k, v in ref.rnn.named_parameters()}
    matched = 0
    for pname, v in model.params.items():
        if pname in model.graph.frozen:
            continue
        if pname in torch_grads:
            np.testing.assert_allclose(got[f"grad.{pname}"], torch_grads[pname], rtol=1e-9, atol=1e-9, err_msg=pname)
            matched += 1
            continue
        k = next(i for i, w in enumerate(values) if w.shape == v.shape and np.array_equal(w.astype(np.float32), v))
        np.testing.assert_allclose(got[f"grad.{pname}"], grads[k], rtol=1e-9, atol=1e-9, err_msg=pname)
        matched += 1
    assert matched == (len(values) if exporter == "torchscript" else len(torch_grads))


def _lstm_node(direction, hidden, **extra):
    return helper.make_node("LSTM", ["X", "W", "R", "B", "lens", "h0", "c0", "P"], ["Y", "Y_h", "Y_c"],
                            direction=direction, hidden_size=hidden, **extra)


def _reference(model, feed):
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(model).run(None, feed)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm_peepholes_sequence_lens_clip_input_forget(direction):
    """Peepholes, sequence_lens shorter than the input (held state, zero outputs), clip,
    non-default activations with alpha / beta, layout 1 (input_forget in reverse: f = 1 - i,
    as onnxruntime couples them); against the equations in numpy."""
    rng = np.random.default_rng(2)
    d, b, t, i, h = 2 if direction == "bidirectional" else 1, 3, 5, 4, 3
    w = {"W": rng.standard_normal((d, 4 * h, i)) * 0.5, "R": rng.standard_normal((d, 4 * h, h)) * 0.5,
         "B": rng.standard_normal((d, 8 * h)) * 0.3, "P": rng.standard_normal((d, 3 * h)) * 0.3}
    w = {k: v.astype(np.float32) for k, v in w.items()}  # the values the initializers hold
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits.append(numpy_helper.from_array(np.array([5, 2, 4], np.int32), "lens"))
    acts = ["HardSigmoid", "LeakyRelu", "ScaledTanh"] * d
    coupled = int(direction == "reverse")
    node = _lstm_node(direction, h, clip=1.5, activations=acts, layout=1, input_forget=coupled,
                      activation_alpha=[0.3, 0.1, 0.9] * d, activation_beta=[0.4, 1.1] * d)
    ins = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [b, t, i]),
           helper.make_tensor_value_info("h0", TensorProto.FLOAT, [b, d, h]),
           helper.make_tensor_value_info("c0", TensorProto.FLOAT, [b, d, h])]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h", "Y_c")]
    proto = helper.make_model(helper.make_graph([node], "g", ins, outs, inits),
                              opset_imports=[helper.make_opsetid("", 14)])
    feed = {"X": rng.standard_normal((b, t, i)), "h0": rng.standard_normal((b, d, h)),
            "c0": rng.standard_normal((b, d, h))}
    got = run_graph(load_onnx(proto).graph, feed)[0]
    want = _numpy_lstm(w, feed, [5, 2, 4], direction, clip=1.5, coupled=coupled)
    for k, v in zip(("Y", "Y_h", "Y_c"), want):
        np.testing.assert_allclose(got[k], v, rtol=1e-10, atol=1e-10, err_msg=k)


def _numpy_lstm(w, feed, lens, direction, clip, coupled):
    """The ONNX LSTM equations with (HardSigmoid 0.3/0.4, LeakyRelu 0.1, ScaledTanh 0.9/1.1)
    activations, written out in numpy, layout 1."""
    a = {k: float(np.float32(k)) for k in (0.1, 0.3, 0.4, 0.9, 1.1)}  # attributes hold float32
    f = lambda v: np.clip(a[0.3] * v + a[0.4], 0, 1)
    g = lambda v: np.where(v > 0, v, a[0.1] * v)
    hh = lambda v: a[0.9] * np.tanh(a[1.1] * v)
    c = lambda v: np.clip(v, -clip, clip)
    x = feed["X"].transpose(1, 0, 2)
    steps, h = x.shape[0], w["R"].shape[2]
    dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    y = np.zeros((steps, len(dirs), x.shape[1], h))
    yh, yc = [], []
    for d, name in enumerate(dirs):
        ht, ct = feed["h0"][:, d].copy(), feed["c0"][:, d].copy()
        pi, po, pf = np.split(w["P"][d], 3)
        for t in (range(steps) if name == "forward" else range(steps - 1, -1, -1)):
            gates = x[t] @ w["W"][d].T + ht @ w["R"][d].T + w["B"][d][:4 * h] + w["B"][d][4 * h:]
            gi, go, gf, gc = np.split(gates, 4, axis=1)
            i_ = f(c(gi + pi * ct))
            f_ = 1 - i_ if coupled else f(c(gf + pf * ct))
            cn = f_ * ct + i_ * g(c(gc))
            hn = f(c(go + po * cn)) * hh(cn)
            live = (t < np.array(lens))[:, None]
            y[t, d] = np.where(live, hn, 0.0)
            ht, ct = np.where(live, hn, ht), np.where(live, cn, ct)
        yh.append(ht)
        yc.append(ct)
    return y.transpose(2, 0, 1, 3), np.stack(yh, 1), np.stack(yc, 1)


def test_gru_linear_before_reset_0_and_initial_state_against_onnx_reference():
    rng = np.random.default_rng(3)
    d, b, t, i, h = 2, 2, 4, 3, 5
    w = {"W": rng.standard_normal((d, 3 * h, i)) * 0.5, "R": rng.standard_normal((d, 3 * h, h)) * 0.5,
         "B": rng.standard_normal((d, 6 * h)) * 0.3}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()]
    node = helper.make_node("GRU", ["X", "W", "R", "B", "", "h0"], ["Y", "Y_h"], direction="bidirectional",
                            hidden_size=h, linear_before_reset=0)
    ins = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [t, b, i]),
           helper.make_tensor_value_info("h0", TensorProto.FLOAT, [d, b, h])]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h")]
    proto = helper.make_model(helper.make_graph([node], "g", ins, outs, inits),
                              opset_imports=[helper.make_opsetid("", 14)])
    feed = {"X": rng.standard_normal((t, b, i)).astype(np.float32),
            "h0": rng.standard_normal((d, b, h)).astype(np.float32)}
    got = run_graph(load_onnx(proto).graph, feed)[0]
    for k, v in zip(("Y", "Y_h"), _reference(proto, feed)):
        np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-5, err_msg=k)


# ------------------------------------------------------------------ control flow
def _graph(nodes, name, ins, outs, inits=()):
    return helper.make_graph(nodes, name, ins, outs, list(inits))


def _vi(name, shape=None, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _control_flow_model():
    """If (known condition) -> Loop (3 iterations, carried y, scan output) -> Scan (an
    RNN-like body), bodies reading the outer-scope weight w and input x."""
    scan_body = _graph([helper.make_node("MatMul", ["s_in", "w"], ["sw"]),
                        helper.make_node("Add", ["sw", "elem"], ["pre"]),
                        helper.make_node("Tanh", ["pre"], ["s_out"]),
                        helper.make_node("Mul", ["s_out", "s_out"], ["sq"])],
                       "scan_body", [_vi("s_in", [4]), _vi("elem", [4])], [_vi("s_out", [4]), _vi("sq", [4])])
    loop_body = _graph([helper.make_node("Identity", ["c_in"], ["c_out"]),
                        helper.make_node("Gather", ["x", "it"], ["row"], axis=0),
                        helper.make_node("Mul", ["y_in", "row"], ["prod"]),
                        helper.make_node("Sigmoid", ["prod"], ["y_out"]),
                        helper.make_node("Add", ["y_out", "row"], ["emit"])],
                       "loop_body", [_vi("it", [], TensorProto.INT64), _vi("c_in", [], TensorProto.BOOL),
                                     _vi("y_in", [4])], [_vi("c_out", [], TensorProto.BOOL), _vi("y_out", [4]),
                                                         _vi("emit", [4])])
    then_b = _graph([helper.make_node("Mul", ["x", "w2"], ["t_out"])], "then", [], [_vi("t_out", [5, 4])])
    else_b = _graph([helper.make_node("Neg", ["x"], ["e_out"])], "else", [], [_vi("e_out", [5, 4])])
    nodes = [helper.make_node("If", ["yes"], ["xs"], then_branch=then_b, else_branch=else_b),
             helper.make_node("Loop", ["three", "", "y0"], ["y_last", "emits"], body=loop_body),
             helper.make_node("Scan", ["y_last", "xs"], ["s_last", "sqs"], body=scan_body, num_scan_inputs=1,
                              scan_input_directions=[1], scan_output_axes=[1])]
    rng = np.random.default_rng(4)
    w, w2 = rng.standard_normal((4, 4)) * 0.5, rng.standard_normal((5, 4))
    inits = [numpy_helper.from_array(w.astype(np.float32), "w"), numpy_helper.from_array(w2.astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(True), "yes"), numpy_helper.from_array(np.array(3, np.int64), "three")]
    g = _graph(nodes, "g", [_vi("x", [5, 4]), _vi("y0", [4])],
               [_vi("y_last", [4]), _vi("emits", [3, 4]), _vi("s_last", [4]), _vi("sqs", [4, 5])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)])


def _torch_control_flow(x, y0, w, w2):
    xs = x * w2
    y, emits = y0, []
    for i in range(3):
        y = torch.sigmoid(y * x[i])
        emits.append(y + x[i])
    s, sqs = y, []
    for t in range(4, -1, -1):
        s = torch.tanh(s @ w + xs[t])
        sqs.append(s * s)
    return y, torch.stack(emits), s, torch.stack(sqs, 1)


def test_if_loop_scan_unrolled_match_torch_autograd():
    proto = _control_flow_model()
    model = load_onnx(proto)
    rng = np.random.default_rng(5)
    x, y0 = rng.standard_normal((5, 4)), rng.standard_normal(4)
    tw = {k: torch.tensor(np.asarray(model.params[k], np.float64), requires_grad=True) for k in ("w", "w2")}
    tx, ty = torch.tensor(x, requires_grad=True), torch.tensor(y0, requires_grad=True)
    touts = _torch_control_flow(tx, ty, tw["w"], tw["w2"])
    cts = [rng.standard_normal(t.shape) for t in touts]
    sum((t * torch.tensor(c)).sum() for t, c in zip(touts, cts)).backward()
    g = with_gradients(model, {k: c.shape for k, c in zip(model.graph.outputs, cts)}, ["x", "y0"])
    got = run_graph(g, {"x": x, "y0": y0, **{f"ct.{k}": c for k, c in zip(model.graph.outputs, cts)}})[0]
    for k, t in zip(model.graph.outputs, touts):
        np.testing.assert_allclose(got[k], t.detach().numpy(), rtol=1e-12, atol=1e-12, err_msg=k)
    for k, t in (("x", tx), ("y0", ty), ("w", tw["w"]), ("w2", tw["w2"])):
        np.testing.assert_allclose(got[f"grad.{k}"], t.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=k)


def test_loop_with_a_computed_condition_and_data_dependent_ops_say_why():
    body = _graph([helper.make_node("ReduceSum", ["y_in"], ["s"], keepdims=0),
                   helper.make_node("Less", ["s", "ten"], ["c_out"]),
                   helper.make_node("Add", ["y_in", "y_in"], ["y_out"])], "body",
                  [_vi("it", [], TensorProto.INT64), _vi("c_in", [], TensorProto.BOOL), _vi("y_in", [3])],
                  [_vi("c_out", [], TensorProto.BOOL), _vi("y_out", [3])])
    inits = [numpy_helper.from_array(np.array(10.0, np.float32), "ten"),
             numpy_helper.from_array(np.array(True), "go")]
    g = _graph([helper.make_node("Loop", ["", "go", "y"], ["out"], body=body)], "g", [_vi("y", [3])],
               [_vi("out", [3])], inits)
    with pytest.raises(NotImplementedError, match="data-dependent trip count"):
        load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)]))
    for op in ("NonZero", "Unique"):
        g = _graph([helper.make_node(op, ["y"], ["out"])], "g", [_vi("y", [3])], [_vi("out")])
        with pytest.raises(NotImplementedError, match="cannot compile for fixed shapes"):
            load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)]))


# ------------------------------------------------------------------------ GPU
class TinyLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 6, batch_first=True, bidirectional=True)
        self.head = nn.Linear(12, 2)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(torch.tanh(y[:, -1]))


def test_lstm_model_trains_on_the_gpu_like_torch(device):
    """A bidirectional LSTM with a linear head: forward and all gradients on the GPU
    against torch (float64), then three SGD-with-momentum steps: the same losses."""
    torch.manual_seed(0)
    module = TinyLSTM()
    batch, steps = 4, 5
    proto = export(module, (torch.randn(batch, steps, 3),))
    rng = np.random.default_rng(6)
    x, labels = rng.standard_normal((batch, steps, 3)), rng.standard_normal((batch, 2))
    ref = copy.deepcopy(module).double()
    tx = torch.tensor(x, requires_grad=True)
    ty = ref(tx)
    ct = rng.standard_normal(ty.shape)
    (ty * torch.tensor(ct)).sum().backward()

    model = load_onnx(proto, batch_size=batch)
    out = next(iter(model.graph.outputs))
    g = with_gradients(model, {out: ct.shape}, ["in0"])
    got = Session(device, Package.from_bytes(compile_graph(g))).run("infer", {"in0": x, f"ct.{out}": ct})
    tol = {"rtol": 1e-4, "atol": 1e-5}
    np.testing.assert_allclose(got[out], ty.detach().numpy(), **tol)
    np.testing.assert_allclose(got["grad.in0"], tx.grad.numpy(), **tol)
    np.testing.assert_allclose(got["grad.head.weight"], ref.head.weight.grad.numpy(), **tol)
    grads = onnx_layout(ref.lstm, {k: v.grad.numpy() for k, v in ref.lstm.named_parameters()})
    values = onnx_layout(module.lstm, {k: v.detach().numpy() for k, v in module.lstm.named_parameters()})
    for pname, v in model.params.items():
        k = next((i for i, w in enumerate(values) if w.shape == v.shape and np.array_equal(w.astype(np.float32), v)),
                 None)
        if k is not None:
            np.testing.assert_allclose(got[f"grad.{pname}"], grads[k], **tol, err_msg=pname)

    train = load_onnx(proto, batch_size=batch)
    session = Session(device, Package.from_bytes(compile_model(train, TrainConfig(loss="mse", optimizer="sgd", lr=0.2))))
    opt = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.9)
    for step in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ref(torch.tensor(x)), torch.tensor(labels))
        loss.backward()
        opt.step()
        ours = float(session.run("train_step", {"in0": x, "labels": labels})["loss"])
        assert abs(ours - loss.item()) <= 1e-4 * max(1.0, abs(loss.item())), (step, ours, loss.item())

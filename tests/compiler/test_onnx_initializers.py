"""Shared initializers: exporters merge equal tensors (fresh LayerNorms' all-ones scales, zero
biases, running statistics) into one initializer; the importer gives each read back the
parameter the torch model has, keeps a tied embedding / LM head as one, says so in
`meganeura info`, and imports a dynamo-exported LSTM's folded weights as torch's own.
Three SGD steps of each on the GPU against torch (float64): losses and every parameter."""
import copy
import io
import warnings

import numpy as np
import onnx  # (the test extra installs it)
import pytest
import torch
from meganeura.compiler import compile_model
from meganeura.compiler.cli import main
from meganeura.compiler.ir.training import TrainConfig
from meganeura.compiler.onnx_import import load_onnx
from meganeura.runtime import Package, Session
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file
from torch import nn

STEPS, LR, BATCH = 3, 0.1, 4
TOL = 1e-5


def export(module, args, dynamo=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            return torch.onnx.export(module, args, dynamo=True, verbose=False).model_proto
        f = io.BytesIO()
        torch.onnx.export(module, args, f, dynamo=False, input_names=[f"in{i}" for i in range(len(args))])
        return onnx.load_from_string(f.getvalue())


class Norms(nn.Module):
    """Two fresh LayerNorms and a BatchNorm."""

    def __init__(self):
        super().__init__()
        self.fc, self.fc2, self.head = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.norm1, self.norm2, self.bn = nn.LayerNorm(8), nn.LayerNorm(8), nn.BatchNorm1d(8)

    def forward(self, x):
        h = torch.relu(self.norm1(self.fc(x)))
        return self.head(self.bn(self.norm2(self.fc2(h))))


class TiedLM(nn.Module):
    """An embedding and an LM head sharing one weight; the head reads [B, T, D] (the TorchScript
    exporter folds its W.T into a new initializer)."""

    def __init__(self):
        super().__init__()
        self.emb, self.norm = nn.Embedding(10, 8), nn.LayerNorm(8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.norm(self.emb(ids))).mean(1)


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.LSTM(3, 4, batch_first=True), nn.Linear(4, 2)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(torch.tanh(y[:, -1]))


def train_against_torch(device, module, proto, feed, labels, loss):
    """Three SGD-with-momentum steps of the compiled package and of torch (float64, train mode:
    a training step normalises with the batch's statistics and updates the running ones), the
    same losses and, after them, every torch parameter and running statistic equal to ours by
    its torch name."""
    model = load_onnx(proto, batch_size=BATCH)
    package = compile_model(model, TrainConfig(loss=loss, optimizer="sgd", lr=LR))
    session = Session(device, Package.from_bytes(package))
    ref = copy.deepcopy(module).double().train()
    opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9)
    args = [torch.tensor(v) if v.dtype.kind in "iu" else torch.tensor(v, dtype=torch.float64) for v in feed.values()]
    target = torch.tensor(labels, dtype=torch.long if loss == "cross_entropy" else torch.float64)
    lossf = nn.functional.cross_entropy if loss == "cross_entropy" else nn.functional.mse_loss
    for step in range(STEPS):
        opt.zero_grad()
        want = lossf(ref(*args), target)
        want.backward()
        opt.step()
        ours = float(session.run("train_step", {**feed, "labels": labels})["loss"])
        assert abs(ours - want.item()) <= TOL, (step, ours, want.item())
    for name, p in [*ref.named_parameters(), *((k, v) for k, v in ref.named_buffers() if "running" in k)]:
        np.testing.assert_allclose(session.read_tensor(name), p.detach().numpy(), rtol=0, atol=TOL, err_msg=name)
    return model, package, session, ref


@pytest.fixture(scope="module")
def norms(device):
    torch.manual_seed(0)
    module = Norms().eval()
    proto = export(module, (torch.randn(BATCH, 6),))
    rng = np.random.default_rng(0)
    feed = {"in0": rng.standard_normal((BATCH, 6)).astype(np.float32)}
    return proto, module, train_against_torch(device, module, proto, feed, rng.integers(0, 3, BATCH).astype(np.int32),
                                              "cross_entropy")


@pytest.fixture(scope="module")
def tied(device):
    torch.manual_seed(1)
    module = TiedLM().eval()
    ids = np.random.default_rng(1).integers(0, 10, (BATCH, 5))
    proto = export(module, (torch.tensor(ids),))
    labels = np.random.default_rng(2).integers(0, 10, BATCH).astype(np.int32)
    return proto, module, train_against_torch(device, module, proto, {"in0": ids}, labels, "cross_entropy")


def test_merged_norm_scales_biases_and_running_statistics_train_apart(norms, tmp_path):
    proto, module, (model, _, session, ref) = norms
    # the exporter did merge them: fewer initializers than torch's tensors, read through Identity
    inits = {i.name for i in proto.graph.initializer}
    assert {"norm2.weight", "norm2.bias", "bn.running_var", "bn.running_mean"}.isdisjoint(inits)
    assert len(inits) < len(module.state_dict()) - 1  # (less num_batches_tracked)
    assert any(n.op_type == "Identity" and n.input[0] == "norm1.weight" for n in proto.graph.node)
    # one parameter per torch tensor, under torch's names; the running statistics frozen
    assert set(model.params) == set(module.state_dict()) - {"bn.num_batches_tracked"}
    assert model.graph.frozen == {"bn.running_mean", "bn.running_var"}
    assert not np.allclose(session.read_tensor("norm1.weight"), session.read_tensor("norm2.weight"))
    assert not np.allclose(session.read_tensor("norm1.weight"), session.read_tensor("bn.running_var"))
    splits = {n.initializer: n.params for n in model.initializer_notes if n.action == "split"}
    assert splits == {"norm1.weight": ("bn.running_var", "bn.weight", "norm1.weight", "norm2.weight"),
                      "norm1.bias": ("bn.bias", "bn.running_mean", "norm1.bias", "norm2.bias")}
    # save_weights writes torch's state_dict names: torch loads them back
    session.save_weights(tmp_path / "w.safetensors")
    saved = load_file(tmp_path / "w.safetensors")
    back = Norms()
    missing, unexpected = back.load_state_dict({k: torch.tensor(v) for k, v in saved.items()}, strict=False)
    assert set(missing) <= {"bn.num_batches_tracked"} and not unexpected
    for k, v in ref.state_dict().items():
        if k != "bn.num_batches_tracked":
            np.testing.assert_allclose(back.state_dict()[k].numpy(), v.numpy(), atol=TOL, err_msg=k)


def test_tied_embedding_and_lm_head_stay_one_parameter(tied):
    proto, _, (model, _, _, _) = tied
    # the exporter stored the head's W.T apart from the embedding: the import ties them again
    assert len([i for i in proto.graph.initializer if list(i.dims) in ([10, 8], [8, 10])]) == 2
    assert set(model.params) == {"emb.weight", "norm.weight", "norm.bias"}
    assert [(n.action, n.initializer) for n in model.initializer_notes] == [("tied", "emb.weight")]


def test_dynamo_merges_are_split_and_ties_kept():
    """The dynamo exporter merges too (its torch calls name the parameters they read)."""
    torch.manual_seed(0)
    norms = Norms().eval()
    proto = export(norms, (torch.randn(BATCH, 6),), dynamo=True)
    assert len(proto.graph.initializer) < len(norms.state_dict()) - 1
    model = load_onnx(proto, batch_size=BATCH)
    assert set(model.params) == set(norms.state_dict()) - {"bn.num_batches_tracked"}
    assert model.graph.frozen == {"bn.running_mean", "bn.running_var"}
    lm = TiedLM().eval()
    model = load_onnx(export(lm, (torch.zeros(BATCH, 5, dtype=torch.long),), dynamo=True), batch_size=BATCH)
    (name,) = {"emb.weight", "head.weight"} & set(model.params)
    assert set(model.params) == {name, "norm.weight", "norm.bias"}
    assert [(n.action, n.initializer) for n in model.initializer_notes] == [("tied", name)]


def test_other_exporters_split_repeated_values_by_module_scope():
    """No Identity, no torch metadata: one all-ones scale read by two modules' LayerNorms (node
    names carry the module path) and one zero bias read as a running mean: one parameter each."""
    ones, zeros = np.ones(4, np.float32), np.zeros(4, np.float32)
    nodes = [helper.make_node("LayerNormalization", ["x", "a.weight", "a.bias"], ["h"], name="/a/LayerNormalization"),
             helper.make_node("LayerNormalization", ["h", "a.weight", "a.bias"], ["h2"], name="/b/LayerNormalization"),
             helper.make_node("BatchNormalization", ["h2", "a.weight", "a.bias", "a.bias", "a.weight"], ["y"],
                              name="/bn/BatchNormalization")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(ones, "a.weight"), numpy_helper.from_array(zeros, "a.bias")])
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert set(model.params) == {"a.weight", "a.bias", "b.weight", "b.bias", "bn.weight", "bn.bias",
                                 "bn.running_mean", "bn.running_var"}
    assert model.graph.frozen == {"bn.running_mean", "bn.running_var"}


def test_info_names_what_was_split_and_tied(norms, tied, tmp_path, capsys):
    for which, (_, _, (_, package, _, _)) in (("norms", norms), ("tied", tied)):
        (tmp_path / f"{which}.mnpk").write_bytes(package)
        assert main(["info", str(tmp_path / f"{which}.mnpk")]) in (0, None)
    out = capsys.readouterr().out
    assert "weights split (the exporter merged equal tensors the model keeps apart): 2" in out
    assert "norm1.weight -> bn.running_var, bn.weight, norm1.weight, norm2.weight" in out
    assert "weights kept tied (one parameter, as in the source model): 1" in out
    assert "emb.weight -> emb.weight: one parameter read by emb, head" in out


def test_dynamo_lstm_trains_under_torch_names_like_torch(device):
    torch.manual_seed(2)
    module = Recurrent().eval()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((BATCH, 5, 3)).astype(np.float32)
    proto = export(module, (torch.tensor(x),), dynamo=True)
    feed = {proto.graph.input[0].name: x}
    model, _, _, _ = train_against_torch(device, module, proto, feed, rng.standard_normal((BATCH, 2)).astype(np.float32),
                                         "mse")
    trained = set(model.params) - model.graph.frozen
    assert trained == {k for k, _ in module.named_parameters()}

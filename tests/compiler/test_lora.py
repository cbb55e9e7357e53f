"""LoRA: adapters beside frozen matmul weights, as PEFT makes them, against a PyTorch reference
written out by hand (y = x W^T + alpha / r x A^T B^T); saved and loaded under PEFT's names,
merged into the weights; the command line's --lora options."""
import numpy as np
import pytest
import torch
from meganeura.compiler import Builder, TrainConfig, compile_model, run_graph
from meganeura.compiler.cli import main
from meganeura.runtime import Package, Session

RANK, ALPHA, LR, STEPS = 2, 6.0, 1e-2, 3
TARGETS = ["q.weight", "v", "head.*"]  # v: a weight stored [in, out], read by a plain matmul


def attention_like(rng):
    """x [4, 3, 6] -> single-head attention (q, k linear, v a matmul weight [in, out]) -> mean -> head."""
    w = {"q.weight": rng.standard_normal((4, 6)), "q.bias": rng.standard_normal(4), "k.weight": rng.standard_normal((4, 6)),
         "v": rng.standard_normal((6, 4)), "head.weight": rng.standard_normal((5, 4)), "head.bias": rng.standard_normal(5)}
    w = {k: (v * 0.5).astype(np.float32) for k, v in w.items()}
    b = Builder()
    x = b.input("x", (4, 3, 6))
    p = {k: b.param(k, v) for k, v in w.items()}
    q, k = b.linear(x, p["q.weight"], p["q.bias"]), b.linear(x, p["k.weight"])
    att = b.softmax(b.matmul(q, k, trans_b=True) * 0.5)
    h = b.mean(b.matmul(att, b.matmul(x, p["v"])), axes=(1,))
    b.output("logits", b.linear(h, p["head.weight"], p["head.bias"]))
    return b.build(), w


def torch_step(w, ad, x):
    """The reference forward: the base weights `w` frozen, adapters `ad` (module -> (A, B))."""
    s = ALPHA / RANK

    def lin(v, name, weight_t):
        a, bb = ad[name]
        return v @ weight_t + s * (v @ a.T) @ bb.T

    q = lin(x, "q", w["q.weight"].T) + w["q.bias"]
    k = x @ w["k.weight"].T
    att = torch.softmax(q @ k.transpose(1, 2) * 0.5, -1)
    h = (att @ lin(x, "v", w["v"])).mean(1)
    return lin(h, "head", w["head.weight"].T) + w["head.bias"]


@pytest.fixture(scope="module")
def trained(device):
    rng = np.random.default_rng(0)
    model, w = attention_like(rng)
    cfg = TrainConfig(lr=LR, lora_rank=RANK, lora_alpha=ALPHA, lora_targets=TARGETS)
    session = Session(device, Package.from_bytes(compile_model(model, cfg)))
    batches = [(rng.standard_normal((4, 3, 6)).astype(np.float32), rng.integers(0, 5, 4).astype(np.int32))
               for _ in range(STEPS)]
    return model, w, session, batches


def test_adapters_start_as_the_base_model_and_only_they_train(trained):
    model, w, session, batches = trained
    assert [(a.module, a.transposed) for a in session.lora.adapters] == [("q", False), ("v", True), ("head", False)]
    x = batches[0][0]
    base = run_graph(model.graph, {"x": x}, np.float32)[0]["logits"]
    np.testing.assert_allclose(session.run("infer", {"x": x})["logits"], base, atol=1e-5)
    frozen = set(session.package.parsed.training.frozen)
    assert set(w) <= frozen and not any("lora" in n for n in frozen)
    a = session.read_tensor("q.lora_A.weight")  # Kaiming-uniform(a=sqrt(5)): U(-1/sqrt(in), 1/sqrt(in))
    assert a.shape == (RANK, 6) and np.abs(a).max() <= 1 / np.sqrt(6) and a.std() > 0.1
    assert not session.read_tensor("head.lora_B.weight").any()


def test_training_follows_pytorch_and_leaves_the_base_weights(trained):
    _, w, session, batches = trained
    tw = {k: torch.tensor(v, dtype=torch.float64) for k, v in w.items()}
    ad = {a.module: tuple(torch.tensor(session.read_tensor(n), dtype=torch.float64, requires_grad=True)
                          for n in (a.a, a.b)) for a in session.lora.adapters}
    opt = torch.optim.AdamW([t for pair in ad.values() for t in pair], lr=LR)  # weight decay 0.01, as ours
    for x, labels in batches:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(torch_step(tw, ad, torch.tensor(x, dtype=torch.float64)),
                                                 torch.tensor(labels, dtype=torch.long))
        loss.backward()
        opt.step()
        got = session.run("train_step", {"x": x, "labels": labels})["loss"]
        np.testing.assert_allclose(got, loss.item(), atol=1e-5)
    for a in session.lora.adapters:
        for name, ref in zip((a.a, a.b), ad[a.module]):
            np.testing.assert_allclose(session.read_tensor(name), ref.detach().numpy(), atol=1e-5, err_msg=name)
    assert session.read_tensor("v.lora_B.weight").any()
    for name, value in w.items():
        np.testing.assert_array_equal(session.read_tensor(name), value)


def test_adapters_save_and_load_under_peft_names(trained, tmp_path):
    from safetensors.numpy import load_file, save_file

    session = trained[2]
    path = tmp_path / "adapter_model.safetensors"
    session.save_adapters(path)
    saved = load_file(str(path))
    assert sorted(saved) == sorted(f"base_model.model.{m}.lora_{x}.weight" for m in ("q", "v", "head") for x in "AB")
    assert saved["base_model.model.v.lora_A.weight"].shape == (RANK, 6)
    assert saved["base_model.model.v.lora_B.weight"].shape == (4, RANK)
    # PEFT's in-memory names (adapter "default") load too; a file that does not match is refused whole
    save_file({k.replace(".weight", ".default.weight"): np.zeros_like(v) for k, v in saved.items()},
              str(tmp_path / "zeros.safetensors"))
    session.load_adapters(tmp_path / "zeros.safetensors")
    assert not session.read_tensor("q.lora_A.weight").any()
    save_file({"base_model.model.k.lora_A.weight": np.zeros((RANK, 6), np.float32)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match="missing"):
        session.load_adapters(tmp_path / "bad.safetensors")
    session.load_adapters(path)
    for k, v in saved.items():
        np.testing.assert_array_equal(session.adapters()[k], v)


def test_merge_folds_the_adapters_into_the_weights(trained):
    _, w, session, batches = trained
    x = batches[0][0]
    before = session.run("infer", {"x": x})["logits"]
    session.merge_adapters()
    np.testing.assert_allclose(session.run("infer", {"x": x})["logits"], before, atol=1e-5)
    for a in session.lora.adapters:
        assert not session.read_tensor(a.b).any()
    assert not np.array_equal(session.read_tensor("v"), w["v"])
    np.testing.assert_array_equal(session.read_tensor("k.weight"), w["k.weight"])


def test_f16_weights_keep_the_frozen_base_in_half_precision():
    model, _ = attention_like(np.random.default_rng(1))
    cfg = TrainConfig(lora_rank=RANK, lora_targets=["*"])
    pkg = Package.from_bytes(compile_model(model, cfg, weights="f16"))
    dtypes = {t.name: t.dtype for t in pkg.plan.tensors if t.role == "param"}
    assert dtypes["q.weight"] == dtypes["v"] == "f16" and dtypes["q.lora_A.weight"] == "f32"
    with pytest.raises(ValueError, match="matches no matmul weight.*head.weight"):
        compile_model(model, TrainConfig(lora_rank=RANK, lora_targets=["q.bias"]))


@pytest.mark.parametrize("damage, says", [
    (lambda lora: lora["adapters"][0].update(b="nothing.weight"), "names no parameter"),
    (lambda lora: lora.update(rank=0), "rank"), (lambda lora: lora.update(alpha="8"), "alpha"),
    (lambda lora: lora["adapters"][0].update(transposed=1), "transposed"),
])
def test_a_damaged_lora_record_is_refused(trained, damage, says):
    import copy

    from meganeura.runtime.errors import PackageError
    from meganeura.runtime.manifest_checks import validate_manifest

    manifest = trained[2].package.manifest
    validate_manifest(manifest)
    manifest = copy.deepcopy(manifest)
    damage(manifest["training"]["lora"])
    with pytest.raises(PackageError, match=says):
        validate_manifest(manifest)


# ------------------------------------------------------------------ the command line
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """An ONNX model as TorchScript exports one: a weight renamed onnx::MatMul_7, stored [in, out],
    that only its node's name ties to its module."""
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), "onnx::MatMul_7"),
             numpy_helper.from_array(rng.standard_normal((5, 5)).astype(np.float32), "head.weight"),
             numpy_helper.from_array(np.zeros(5, np.float32), "head.bias")]
    nodes = [helper.make_node("MatMul", ["x", "onnx::MatMul_7"], ["h"], name="/encoder/attention/query/MatMul"),
             helper.make_node("Gemm", ["h", "head.weight", "head.bias"], ["logits"], name="/head/Gemm", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [4, 5])], inits)
    path = tmp_path_factory.mktemp("lora") / "exported.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def refused(capsys, argv) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("options, says", [
    (["--train", "--lora", "0", "--lora-targets", "*"], "--lora"),
    (["--train", "--lora", "two", "--lora-targets", "*"], "--lora"),
    (["--train", "--lora", "2", "--lora-targets", "*", "--lora-alpha", "0"], "--lora-alpha"),
    (["--lora", "2", "--lora-targets", "*"], "--train"),
    (["--train", "--lora", "2"], "--lora-targets"),
    (["--train", "--lora-targets", "*"], "--lora"),
    (["--train", "--lora", "2", "--lora-targets", "*query*", "--lora-targets", "*decoder*"], "head.weight"),
])
def test_lora_options_are_checked(capsys, exported, tmp_path, options, says):
    err = refused(capsys, ["compile", str(exported), "-o", str(tmp_path / "o.mnpk"), *options])
    assert says in err
    assert not (tmp_path / "o.mnpk").exists()
    if says == "head.weight":
        assert "'*decoder*'" in err and "onnx::MatMul_7" in err and "head.bias" in err


def test_lora_targets_match_node_names_and_info_shows_the_adapters(capsys, exported, tmp_path):
    out = tmp_path / "o.mnpk"
    assert main(["compile", str(exported), "-o", str(out), "-q", "--train", "--lora", "3",
                 "--lora-targets", "*attention*query*", "--lora-alpha", "12", "--weights", "f16"]) == 0
    lora = Package.load(out).manifest["training"]["lora"]
    assert lora == {"rank": 3, "alpha": 12.0, "adapters": [
        {"module": "encoder.attention.query", "weight": "onnx::MatMul_7", "a": "encoder.attention.query.lora_A.weight",
         "b": "encoder.attention.query.lora_B.weight", "transposed": True}]}
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert "LoRA adapters: 1 (rank 3, alpha 12, scale 4) on encoder.attention.query" in info
    assert f"trainable {3 * 6 + 5 * 3} of {6 * 5 + 5 * 5 + 5 + 3 * 6 + 5 * 3} values" in info

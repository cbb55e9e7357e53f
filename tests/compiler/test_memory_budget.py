"""A memory budget for the training step: forward values recomputed in the backward pass
(passes/remat.py) change no number, the step's buffers fit the budget, a budget under the
smallest reachable one is refused naming it; the command line's --memory-budget and `info`."""
import dataclasses
import re

import numpy as np
import pytest
from meganeura.compiler import Builder, TrainConfig, compile_model, run_graph
from meganeura.compiler.cli import main
from meganeura.compiler.ir.training import build_training_graph
from meganeura.compiler.options import DEFAULT
from meganeura.compiler.passes.prepare import prepare
from meganeura.compiler.passes.remat import BudgetError, parse_size, rematerialise
from meganeura.runtime import Package, Session

STEPS, BATCH, TOKENS, WIDTH, CLASSES = 3, 4, 8, 32, 5


def residual_mlp(rng, blocks=3):
    """x [4, 8, 32] -> blocks of x + W2 gelu(W1 layer_norm(x)) -> mean over tokens -> head."""
    b = Builder()
    x = b.input("x", (BATCH, TOKENS, WIDTH))
    h = x
    for i in range(blocks):
        ln = b.layer_norm(h, b.param(f"b{i}.ln.weight", np.ones(WIDTH, np.float32)),
                          b.param(f"b{i}.ln.bias", np.zeros(WIDTH, np.float32)), eps=1e-5)
        w1 = b.param(f"b{i}.fc1.weight", (rng.standard_normal((2 * WIDTH, WIDTH)) * 0.2).astype(np.float32))
        w2 = b.param(f"b{i}.fc2.weight", (rng.standard_normal((WIDTH, 2 * WIDTH)) * 0.2).astype(np.float32))
        h = h + b.linear(b.gelu(b.linear(ln, w1)), w2)
    head = b.param("head.weight", (rng.standard_normal((CLASSES, WIDTH)) * 0.2).astype(np.float32))
    b.output("logits", b.linear(b.mean(h, axes=(1,)), head))
    return b.build()


def step_peak(data: bytes) -> int:
    return Package.from_bytes(data).parsed.training.memory.peak_bytes


@pytest.fixture(scope="module")
def packages():
    """The unbudgeted package, the smallest reachable budget, and a package budgeted between."""
    model = residual_mlp(np.random.default_rng(0))
    plain = compile_model(model, TrainConfig(lr=1e-2))
    with pytest.raises(BudgetError) as refused:
        compile_model(model, TrainConfig(lr=1e-2, memory_budget=1))
    unbudgeted = Package.from_bytes(plain).parsed
    from meganeura.runtime.package_summary import step_bytes
    full = step_bytes(unbudgeted)
    budget = (refused.value.reachable + full) // 2
    budgeted = compile_model(model, TrainConfig(lr=1e-2, memory_budget=budget))
    return model, plain, budgeted, budget, full, refused.value


def test_budgeted_peak_fits_under_the_unbudgeted(packages):
    _, _, budgeted, budget, full, refused = packages
    memory = Package.from_bytes(budgeted).parsed.training.memory
    assert refused.reachable < full, "the model leaves nothing to recompute"
    assert memory.peak_bytes <= budget < full == memory.unbudgeted_peak_bytes
    assert memory.rematerialised > 0 and memory.rematerialised_bytes > 0
    assert 0 < memory.extra_flops < memory.step_flops
    from meganeura.runtime.package_summary import step_bytes
    assert step_bytes(Package.from_bytes(budgeted).parsed) == memory.peak_bytes


def test_unreachable_budget_names_the_smallest(packages):
    model, *_, refused = packages
    assert f"{refused.reachable} bytes" in str(refused) and isinstance(refused, ValueError)
    assert refused.floor <= refused.reachable
    compile_model(model, TrainConfig(lr=1e-2, memory_budget=refused.reachable))  # that one fits


def same_steps(device, plain: bytes, budgeted: bytes, batches) -> tuple:
    """Train both packages on `batches`: their losses and weights must be equal bit for bit.
    Returns the losses and the weights."""
    runs = []
    for data in (plain, budgeted):
        session = Session(device, Package.from_bytes(data))
        runs.append((np.array([session.run("train_step", batch)["loss"] for batch in batches]), session.weights()))
    (l0, w0), (l1, w1) = runs
    np.testing.assert_array_equal(l0, l1)
    for name in w0:
        np.testing.assert_array_equal(w0[name], w1[name], err_msg=name)
    return l0, w0


def test_budget_changes_no_number(device, packages):
    """Three steps: the same losses and weights, bit for bit (the same kernels on the same values)."""
    _, plain, budgeted, *_ = packages
    rng = np.random.default_rng(1)
    batches = [{"x": rng.standard_normal((BATCH, TOKENS, WIDTH)).astype(np.float32),
                "labels": rng.integers(0, CLASSES, BATCH).astype(np.int32)} for _ in range(STEPS)]
    losses, weights = same_steps(device, plain, budgeted, batches)
    assert np.all(np.isfinite(losses)) and len(set(losses.tolist())) == STEPS
    initial = Package.from_bytes(plain).weights
    assert all(not np.array_equal(weights[name], initial[name]) for name in weights if name.endswith("fc1.weight"))


def tiny_llama():
    """A two-layer Llama (bench/models.py's smoke SmolLM2) with LoRA on the attention projections."""
    from meganeura.compiler.models.llama import LlamaConfig, llama
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, rope_theta=1000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)
    targets = [f"model.layers.*.self_attn.{m}_proj.weight" for m in "qkvo"]
    train = TrainConfig(loss="cross_entropy", optimizer="adamw", lr=1e-3, lora_rank=8, lora_alpha=16.0,
                        lora_targets=targets)
    return llama(config, batch=2, seq=16, flatten_logits=True), train


def test_llama_lora_at_the_smallest_budget(device):
    """Recomputed MLP inputs wait for the backward matmul whose product their epilogue multiplies:
    the matmul keeps that epilogue out of its store (else each waits for the other). Three steps
    at the smallest reachable budget: the same losses and weights, bit for bit."""
    model, train = tiny_llama()
    plain = compile_model(model, train)
    with pytest.raises(BudgetError) as refused:
        compile_model(model, dataclasses.replace(train, memory_budget=1))
    budgeted = compile_model(model, dataclasses.replace(train, memory_budget=refused.value.reachable))
    memory = Package.from_bytes(budgeted).parsed.training.memory
    assert memory.peak_bytes <= refused.value.reachable < memory.unbudgeted_peak_bytes and memory.rematerialised > 0
    rng = np.random.default_rng(5)
    batches = [{"input_ids": rng.integers(0, 97, (2, 16)).astype(np.int32),
                "labels": rng.integers(0, 97, 32).astype(np.int32)} for _ in range(STEPS)]
    losses, weights = same_steps(device, plain, budgeted, batches)
    assert np.all(np.isfinite(losses)) and len(set(losses.tolist())) == STEPS


def test_resnet_at_the_smallest_budget(device):
    """A stage of three bottleneck blocks (batch norms in training mode) reaches a budget
    under 0.8 of its unbudgeted peak: blocks recomputed from kept values, a clone made anew
    for readers far apart, the running statistics updated from the forward's own
    statistics. Two steps at that budget: the same losses and weights, bit for bit."""
    from meganeura.compiler.models.resnet import resnet
    from meganeura.runtime.package_summary import step_bytes
    model = resnet("bottleneck", (3,), batch=2, image_size=32, num_classes=CLASSES, width=8)
    train = TrainConfig(lr=1e-2, loss="cross_entropy")
    plain = compile_model(model, train)
    with pytest.raises(BudgetError) as refused:
        compile_model(model, dataclasses.replace(train, memory_budget=1))
    assert refused.value.reachable < 0.8 * step_bytes(Package.from_bytes(plain).parsed)
    budgeted = compile_model(model, dataclasses.replace(train, memory_budget=refused.value.reachable))
    rng = np.random.default_rng(6)
    batches = [{"x": rng.standard_normal((2, 3, 32, 32)).astype(np.float32),
                "labels": rng.integers(0, CLASSES, 2).astype(np.int32)} for _ in range(2)]
    losses, weights = same_steps(device, plain, budgeted, batches)
    assert np.all(np.isfinite(losses)) and any(name.endswith("running_mean") for name in weights)


def test_half_weights_count_as_stored():
    """weights="f16": the budget holds the frozen weights in f16, as the package stores them."""
    from meganeura.runtime.package_summary import step_bytes
    model, train = tiny_llama()
    plain = Package.from_bytes(compile_model(model, train, weights="f16")).parsed
    budget = step_bytes(plain) - 1
    budgeted = Package.from_bytes(compile_model(model, dataclasses.replace(train, memory_budget=budget),
                                                weights="f16")).parsed
    memory = budgeted.training.memory
    assert memory.unbudgeted_peak_bytes == step_bytes(plain) and step_bytes(budgeted) == memory.peak_bytes <= budget
    assert any(t.dtype == "f16" for t in budgeted.tensors)


def test_recomputed_graph_matches_the_interpreter():
    """Every forward value the backward reads recomputed: float64 results unchanged."""
    from meganeura.compiler.passes import remat
    from meganeura.compiler.passes.schedule import schedule
    model = residual_mlp(np.random.default_rng(2))
    g = prepare(build_training_graph(model.graph, TrainConfig(lr=1e-2)), DEFAULT)
    forward = remat.forward_of(g)
    cands = remat.candidates(g, forward, schedule(g).inlined)
    plan = rematerialise(g, set(cands), cands, forward)
    assert plan.values == len(cands) > 0 and plan.extra_flops > 0
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal((BATCH, TOKENS, WIDTH)), "labels": rng.integers(0, CLASSES, BATCH),
              "__row_mask": np.ones(BATCH)}
    (out0, new0), (out1, new1) = run_graph(g, inputs), run_graph(plan.graph, inputs)
    assert out0["loss"] == out1["loss"]
    for name in new0:
        np.testing.assert_array_equal(new0[name], new1[name], err_msg=name)


@pytest.mark.parametrize("text, size", [("256MiB", 256 << 20), ("1GiB", 1 << 30), ("1.5GB", 1_500_000_000),
                                        ("1000000", 1_000_000), ("64 kb", 64_000)])
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "12 parsecs", "-1MiB", "0", "nan", "1e400GB"])
def test_bad_sizes(text):
    with pytest.raises(ValueError):
        parse_size(text)


def _onnx_mlp(path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 32)) * 0.3).astype(np.float32), f"w{i}")
             for i in range(3)]
    inits[2] = numpy_helper.from_array((rng.standard_normal((32, CLASSES)) * 0.3).astype(np.float32), "w2")
    inits[1] = numpy_helper.from_array((rng.standard_normal((32, 32)) * 0.3).astype(np.float32), "w1")
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"]), helper.make_node("Relu", ["h0"], ["a0"]),
             helper.make_node("MatMul", ["a0", "w1"], ["h1"]), helper.make_node("Relu", ["h1"], ["a1"]),
             helper.make_node("MatMul", ["a1", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, CLASSES])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_cli_budget_and_info(tmp_path, capsys):
    model = tmp_path / "mlp.onnx"
    _onnx_mlp(model)
    out = tmp_path / "mlp.mnpk"
    assert main(["compile", str(model), "-o", str(out), "--train", "--memory-budget", "1", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--memory-budget" in err and "smallest budget it can reach" in err
    reachable = int(re.search(r"can reach is [^(]*\((\d+) bytes\)", err).group(1))
    assert main(["compile", str(model), "-o", str(out), "--train", "--memory-budget", str(reachable), "-q"]) == 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert f"memory budget {reachable} bytes" in info and "rematerialised" in info and "FLOPs" in info


@pytest.mark.parametrize("args", [["--memory-budget", "lots"], ["--memory-budget", "0"], ["--memory-budget", "1GiB"]])
def test_cli_refuses_bad_budgets(tmp_path, capsys, args):
    model = tmp_path / "mlp.onnx"
    _onnx_mlp(model)
    train = [] if args[-1] == "1GiB" else ["--train"]  # a budget without --train is refused too
    assert main(["compile", str(model), "-o", str(tmp_path / "o.mnpk"), *train, *args, "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "--memory-budget" in err

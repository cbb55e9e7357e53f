"""Scheduling: fusion decisions, binding limits, in-place updates after their readers."""
import numpy as np
import pytest

from meganeura.compiler import Builder, TrainConfig, compile_model, run_graph
from meganeura.compiler.passes.prepare import prepare
from meganeura.compiler.passes.records import MAX_BINDINGS
from meganeura.compiler.passes.schedule import schedule
from meganeura.compiler.ir.training import build_training_graph
from meganeura.compiler.options import CompileOptions
from meganeura.runtime import Package, Session


def test_a_wide_elementwise_chain_is_split_to_fit_the_bindings(device):
    b = Builder()
    xs = [b.input(f"x{i}", (5, 3)) for i in range(40)]
    acc = xs[0]
    for x in xs[1:]:
        acc = acc * 0.9 + b.exp(x)
    b.output("y", acc)
    model = b.build()
    sched = schedule(prepare(model.graph))
    assert all(len(k.reads) + len(k.roots) <= MAX_BINDINGS for k in sched.kernels)
    vals = {f"x{i}": np.random.default_rng(i).random((5, 3)) for i in range(40)}
    got = Session(device, Package.from_bytes(compile_model(model))).run("infer", vals)["y"]
    ref = run_graph(model.graph, vals)[0]["y"]
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-6


def _mlp():
    b = Builder()
    x = b.input("x", (8, 6))
    rng = np.random.default_rng(0)
    h = b.relu(b.linear(x, b.param("a.weight", rng.standard_normal((7, 6))), b.param("a.bias", np.zeros(7))))
    b.output("y", b.linear(h, b.param("b.weight", rng.standard_normal((3, 7))), b.param("b.bias", np.zeros(3))))
    return b.build()


def test_optimizer_updates_write_in_place_after_every_reader():
    g = prepare(build_training_graph(_mlp().graph, TrainConfig(optimizer="adamw")))
    sched = schedule(g)
    params = {n.attr("name"): i for i, n in enumerate(g.nodes) if n.op == "param"}
    writer = {}
    for pos, k in enumerate(sched.kernels):
        for r in k.roots:
            if sched.storage.get(r) in params.values():
                writer[sched.storage[r]] = pos
    assert set(writer) == set(params.values())  # every weight updated in place, no copies
    for leaf, pos in writer.items():
        readers = [i for i, k in enumerate(sched.kernels) if leaf in k.reads and i != pos]
        assert all(i < pos for i in readers)


def test_matmul_bias_relu_fuse_into_the_matmul():
    sched = schedule(prepare(_mlp().graph))
    kinds = [k.kind for k in sched.kernels]
    assert kinds == ["matmul", "matmul"], kinds  # bias and ReLU run in the matmuls' epilogues
    assert [sorted(sched.graph.nodes[m].op for m in k.epilogue) for k in sched.kernels] == [["add", "relu"], ["add"]]


def test_a_view_of_a_written_transpose_waits_for_its_writer(run_on_gpu):
    """attention -> head transpose (written in place by the attention) -> transpose back
    (read in place by a second attention): the reader depends on the first attention even
    though neither transpose has a kernel. It once ran first when the writer landed late."""
    rng = np.random.default_rng(0)
    b = Builder()
    shape = (1, 2, 4, 8)
    x, y, k, v = (b.input(n, shape) for n in "xykv")
    a = x * 2.0
    sm = b.softmax(a)  # a is stored (a non-elementwise kernel reads it)
    m2 = b.matmul(y, b.param("w", rng.standard_normal((8, 8))))  # placed after a's kernel
    o = b.op("attention", a + m2, k, v)
    back = b.transpose(b.transpose(o, (0, 2, 1, 3)), (0, 2, 1, 3))
    b.output("y", b.op("attention", back, k, v) + sm)
    b.output("m2", m2)
    inputs = {n: rng.standard_normal(shape) for n in "xykv"}
    ref = run_graph(b.g, inputs, np.float64)[0]["y"]
    got = run_on_gpu(b.g, inputs)["y"]
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_a_sum_over_integers(run_on_gpu):
    """Reductions accumulate in f32 and store in the node's dtype (a count of class ids)."""
    b = Builder()
    y = b.input("y", (5, 7), "i32")
    b.output("s", b.sum(b.cast(b.cast(y, to="f32") * 2.0, to="i32"), axes=(1,)))
    b.output("c", b.sum(y, axes=(0,)))
    vals = {"y": np.arange(35, dtype=np.int32).reshape(5, 7) - 10}
    got = run_on_gpu(b.g, vals)
    np.testing.assert_array_equal(got["s"], (vals["y"] * 2).sum(1))
    np.testing.assert_array_equal(got["c"], vals["y"].sum(0))


def _stacked_attention(layers=3, t=256, h=2, d=8):
    """Attention layers whose [1, h, t, t] scores (512 KB) dwarf everything else they hold."""
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (1, t, h * d))
    y = x
    for i in range(layers):
        qkv = [b.transpose(b.reshape(b.linear(y, b.param(f"l{i}.{n}", rng.standard_normal((h * d, h * d)) * 0.3)),
                                     (1, t, h, d)), (0, 2, 1, 3)) for n in "qkv"]
        y = y + b.reshape(b.transpose(b.attention(*qkv), (0, 2, 1, 3)), (1, t, h * d))
    b.output("y", y)
    return b.build()


def test_sinking_recomputation_chains_holds_one_layers_scores_and_keeps_answers(device):
    """CompileOptions.sink_chains: the backward's recomputed scores and probabilities (the
    attention decomposition's gradient) move down to their layer's turn instead of all
    layers' being held at once; the step computes the same bits."""
    runs = {}
    rng = np.random.default_rng(1)
    feed = {"x": rng.standard_normal((1, 256, 16)), "labels": rng.standard_normal((1, 256, 16))}
    for sink in (False, True):
        options = CompileOptions(sink_chains=sink)
        pkg = Package.from_bytes(compile_model(_stacked_attention(), TrainConfig(loss="mse"), options=options))
        session = Session(device, pkg)
        loss = session.run("train_step", dict(feed))["loss"]
        runs[sink] = (pkg.programs["train_step"]["scratch_peak_bytes"], loss, session.weights())
    scores = 2 * 256 * 256 * 4
    assert runs[True][0] <= runs[False][0] - 0.75 * scores, (runs[False][0], runs[True][0])
    assert runs[True][1] == runs[False][1]
    for name, w in runs[False][2].items():
        np.testing.assert_array_equal(runs[True][2][name], w, err_msg=name)


def test_a_cycle_is_reported_briefly():
    """Kernels that wait for each other (a compiler bug) are reported by count and a first few."""
    b = Builder()
    h = b.input("x", (4, 8))
    for i in range(30):
        h = b.linear(h, b.param(f"w{i}", np.eye(8, dtype=np.float32)))
    b.output("y", h)
    g = prepare(b.build().graph)
    matmuls = [i for i, n in enumerate(g.nodes) if n.op == "matmul"]
    with pytest.raises(RuntimeError, match="cycle between kernels") as cycle:
        schedule(g, after={matmuls[0]: matmuls[-1]})  # the first waits for the last, which reads it
    assert f"{len(matmuls)} kernels wait" in str(cycle.value) and len(str(cycle.value)) < 200


def test_a_trained_scalar_with_adamw_schedules_and_trains(device):
    """A 0-d parameter (CLIP's logit_scale) trained with AdamW: its moments are scalars like
    the step counter, whose in-place write must follow the bias corrections reading the old
    step; grouping them made a cycle. Three steps against torch's AdamW in float64."""
    import numpy as np
    from meganeura.compiler import TrainConfig, compile_model
    from meganeura.compiler.ir.builder import Builder
    from meganeura.runtime import Package, Session

    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (4, 3))
    h = b.linear(x, b.param("w", rng.normal(size=(5, 3))), b.param("bias", np.zeros(5)))
    b.output("logits", h * b.param("scale", np.array(2.0)))
    s = Session(device, Package.from_bytes(compile_model(b.build(), TrainConfig(optimizer="adamw", lr=0.1))))
    xs, ys = rng.normal(size=(4, 3)).astype(np.float32), np.array([0, 1, 2, 3])
    losses = [float(s.run("train_step", {"x": xs, "labels": ys})["loss"]) for _ in range(3)]
    scale = float(s.weights()["scale"])
    import torch

    W = torch.tensor(np.random.default_rng(0).normal(size=(5, 3)), requires_grad=True)  # the same draw as w
    B = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    S = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.AdamW([W, B, S], lr=0.1)
    ref = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy((torch.tensor(xs, dtype=torch.float64) @ W.T + B) * S,
                                                 torch.tensor(ys))
        loss.backward()
        opt.step()
        ref.append(loss.item())
    assert np.allclose(losses, ref, rtol=1e-5), (losses, ref)
    assert abs(scale - S.item()) < 1e-5 and scale != 2.0

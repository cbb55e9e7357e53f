"""The compiler driver: a Model (and a training recipe) in, package bytes out.

Each stage is one call, in the order a model walks them:

    import (onnx/, models/, the Builder)  -> Model
    ir.lora.add_adapters                  -> the forward graph with LoRA adapters (train.lora_rank)
    ir.training.build_training_graph      -> the training step as a Graph (with `train`)
    passes.prepare                        -> graphs of ops that have kernels
    passes.remat.fit                      -> the step recomputing values to fit train.memory_budget
    passes.half_weights                   -> f16 weights (with options.weights == "f16"; before the
                                             fit, when there is one, which counts them as stored)
    passes.schedule                       -> Schedule: kernels, order, storage
    package.writer (codegen inside)       -> WGSL, buffers, dispatches, the file's bytes
"""
from __future__ import annotations

import functools
import gc
import time
from dataclasses import dataclass, field

import numpy as np

from meganeura import __version__

from .ir.builder import Model
from .ir.graph import Graph
from .ir.lora import Adapters, add_adapters
from .ir.training import ROW_MASK, TrainConfig, build_training_graph
from .options import DEFAULT, CompileOptions
from .package.blob import Reservation
from .package.writer import PackageBuilder, initializer_notes
from .passes.half_weights import half_weights
from .passes.prepare import prepare
from .passes.remat import fit, parse_size
from .passes.schedule import schedule


STAGE_NAMES = {"infer": "schedule inference", "train_step": "schedule training step"}


@dataclass(frozen=True)
class Programs:
    """The prepared graphs of a package, by program name ("infer", "train_step", ...)."""
    graphs: dict  # name -> prepared Graph
    extra: dict  # name -> the program's extra manifest fields
    after: dict = field(default_factory=dict)  # name -> the scheduler's `after` (passes/remat.py)


def _without_cyclic_gc(fn):
    """Run a compile with Python's cycle collector paused. A compile allocates millions of
    small objects, and each full collection walks the host's whole heap (a process holding
    PyTorch models pays for theirs too). What the compile drops is freed by reference
    counting; cycles wait for the next collection."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()
    return run


def _options(options: CompileOptions | None, **legacy) -> CompileOptions:
    """`options`, or the defaults, with compile_model's shorthand keyword arguments applied."""
    options = options or DEFAULT
    given = {k: v for k, v in legacy.items() if v is not None}
    return options.replace(**given) if given else options


@_without_cyclic_gc
def compile_model(model: Model, train: TrainConfig | None = None, source: dict | None = None,
                  progress=None, share_scratch: bool | None = None, weights: str | None = None,
                  options: CompileOptions | None = None) -> bytes:
    """Compile `model` into package bytes: program "infer", and "train_step" with `train`.

    Args:
        model: the model (from load_onnx, meganeura.compiler.models, or the Builder).
        train: the training recipe; None compiles inference only.
        source: where the model came from, recorded in the manifest.
        progress: called with each stage's name before it runs (the CLI shows a progress bar).
        share_scratch: shorthand for `CompileOptions.share_scratch`.
        weights: shorthand for `CompileOptions.weights` ("f32" or "f16").
        options: every other choice of the compiler (compiler/options.py).
    Returns:
        The package file's bytes.
    Raises:
        ValueError: the model or the recipe cannot compile (a message in their terms).
    """
    t0 = time.perf_counter()
    options = _options(options, share_scratch=share_scratch, weights=weights)
    step = progress or (lambda name: None)
    reservation = Reservation(estimated_package_bytes(model))  # its pages are touched meanwhile
    step("forward graph")
    lora = _adapters(model, train)
    forward = model.graph if lora is None else lora.graph
    graphs, extra, after = {"infer": prepare(forward, options)}, {}, {}
    meta = {"source": source or {}, "batch": _batch_info(model), **initializer_notes(model)}
    if train is not None:
        step("autodiff and optimizer")
        tg = prepare(build_training_graph(forward, train, options), options)
        memory = {}
        if train.memory_budget is not None:
            step("fit the memory budget")
            if options.weights == "f16":  # the budget holds the weights as the package stores them
                half_weights([graphs["infer"], tg])
            tg, after["train_step"], memory = _fit(tg, parse_size(train.memory_budget), options)
        graphs["train_step"], extra["train_step"] = tg, {"row_mask": ROW_MASK}
        meta["training"] = {"loss": train.loss, "optimizer": train.optimizer, "lr": train.lr,
                            "frozen": sorted(tg.frozen), "row_mask": ROW_MASK, "ignore_index": train.ignore_index,
                            **_classes(model, train), **({"lora": lora.manifest()} if lora else {}), **memory}
    return _write(Programs(graphs, extra, after), options, meta, step, reservation, t0)


def _fit(graph: Graph, budget: int, options: CompileOptions) -> tuple:
    """The training graph recomputing what it must to fit `budget` bytes (passes/remat.py),
    the scheduler's `after` for it, and the manifest's record of it.

    Raises:
        BudgetError (a ValueError): the smallest budget the step reaches is larger."""
    def measure(g, after):  # the step's buffers, as a package holding only this program places them
        pb = PackageBuilder(__version__, options)  # (add_program lays out the parameter groups)
        pb.add_program("train_step", schedule(g, options, after))
        return sum(pb.buffers)

    plan = fit(graph, budget, measure, schedule(graph, options).inlined)
    return plan.graph, plan.after, {"memory": plan.manifest(budget)}


def _adapters(model: Model, train: TrainConfig | None) -> Adapters | None:
    """The forward graph with the LoRA adapters `train` asks for (None without lora_rank); both
    programs run them, "infer" too, so that it answers with what training learned."""
    if train is None or train.lora_rank is None:
        if train is not None and train.lora_targets:
            raise ValueError("lora_targets without lora_rank: give the adapters' rank")
        return None
    # an ONNX import records which of its nodes read each parameter (`param_users`)
    return add_adapters(model.graph, train.lora_rank, train.lora_alpha, train.lora_targets,
                        getattr(model, "param_users", None), train.lora_seed)


def _write(programs: Programs, options: CompileOptions, meta: dict, step, reservation=None, t0=None) -> bytes:
    """Half weights, schedules and the package file of prepared programs."""
    graphs = programs.graphs
    if options.weights == "f16":
        half_weights(list(graphs.values()))
    pb = PackageBuilder(__version__, options)
    pb.reservation = reservation
    pb.start_blob_hash(graphs.values())  # the weights are fixed: hashed on a thread meanwhile
    pb.plan_arenas([g for g in graphs.values() if g.arenas])  # before any program places the parameters
    for name, g in graphs.items():
        step(STAGE_NAMES.get(name, f"schedule {name}"))
        pb.add_program(name, schedule(g, options, programs.after.get(name)), programs.extra.get(name))
    step("write package")
    if t0 is not None:
        meta["compile_seconds"] = round(time.perf_counter() - t0, 4)
    return pb.write(meta)


def _classes(model: Model, train: TrainConfig) -> dict:
    """{"classes": N} for a cross-entropy package (its output is [batch, N]): the runtime refuses
    labels outside [0, N) before they reach the GPU."""
    outputs = model.graph.outputs
    name = train.output or (next(iter(outputs)) if len(outputs) == 1 else None)
    shape = model.graph.nodes[outputs[name]].shape if name in outputs else ()
    return {"classes": int(shape[1])} if train.loss == "cross_entropy" and len(shape) == 2 else {}


def estimated_package_bytes(model: Model) -> int:
    """Weights plus a generous head (kernels, plan): the Reservation shrinks to fit; growing
    past it only costs the pages not touched in advance."""
    weights = sum(int(np.asarray(v).size) * 4 for v in model.params.values() if v is not None)
    return weights + weights // 64 + (4 << 20)


def _batch_info(model: Model) -> dict | None:
    """The batch size, when every input and output starts with the same dimension.

    The runtime then pads a smaller batch (masking padded rows out of the loss) and
    splits a larger one for inference.
    """
    g = model.graph
    firsts = [g.nodes[i].shape[0] if g.nodes[i].shape else None
              for i in list(g.inputs.values()) + list(g.outputs.values())]
    if not firsts or None in firsts or len(set(firsts)) != 1:
        return None
    return {"size": int(firsts[0])}


@_without_cyclic_gc
def compile_programs(programs: dict, source: dict | None = None, meta: dict | None = None,
                     weights: str | None = None, options: CompileOptions | None = None) -> bytes:
    """Compile several graphs into one package, one program each (name -> Graph).

    Parameters, optimizer state and inputs with the same name share one buffer across
    programs; a program can hand a tensor to another through a state it assigns (e.g. an
    inference program caching features that a training program reads)."""
    if "infer" not in programs:
        raise ValueError("a package needs an 'infer' program")
    options = _options(options, weights=weights)
    graphs = {name: prepare(graph, options) for name, graph in programs.items()}
    extra = {name: {"row_mask": ROW_MASK} for name, g in graphs.items() if ROW_MASK in g.inputs}
    return _write(Programs(graphs, extra), options, {"source": source or {}, "batch": None, **(meta or {})},
                  lambda name: None)


def compile_graph(graph: Graph, program: str = "infer", options: CompileOptions | None = None) -> bytes:
    """Compile a raw Graph (any outputs, e.g. gradients made with autodiff.gradients) into a
    package whose one program runs it (and "infer" too). Used by tests and tools."""
    options = options or DEFAULT
    graphs = {program: prepare(graph, options)}
    if program != "infer":
        graphs["infer"] = prepare(graph, options)
    return _write(Programs(graphs, {}), options, {"source": {"kind": "graph"}, "batch": None}, lambda name: None)

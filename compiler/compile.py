"""The compiler driver: a Model (and a training recipe) in, package bytes out."""
from __future__ import annotations

import functools
import gc
import time

import numpy as np

from . import __version__
from .blob import Reservation
from .builder import Model
from .half_weights import half_weights
from .package_writer import PackageBuilder
from .prepare import prepare
from .schedule import schedule
from .training import ROW_MASK, TrainConfig, build_training_graph


def _without_cyclic_gc(fn):
    """Run a compile with Python's cycle collector paused. A compile allocates millions of
    small objects, and each full collection walks the host's whole heap: inside a process
    holding PyTorch models the SD-1.5 compile took 1.8-2.8 s instead of 1.6. What the
    compile drops is freed by reference counting; cycles wait for the next collection."""
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


WEIGHT_TYPES = ("f32", "f16")


def _weights_as(graphs, weights: str) -> None:
    """Store the weights that `weights` allows in half precision (half_weights.py)."""
    if weights not in WEIGHT_TYPES:
        raise ValueError(f"weights must be one of {WEIGHT_TYPES}, not {weights!r}")
    if weights == "f16":
        half_weights(graphs)


@_without_cyclic_gc
def compile_model(model: Model, train: TrainConfig | None = None, source: dict | None = None,
                  progress=None, share_scratch: bool = False, weights: str = "f32") -> bytes:
    """Compile `model` into package bytes: program "infer", and "train_step" with `train`.

    `progress(step_name)` is called before each stage (the CLI shows a progress bar).
    `share_scratch`: infer and train_step share scratch buffers (less memory), for hosts
    that never run inference between the chunks of a training step.
    `weights="f16"`: the weights only matmuls and convolutions read, and no training step
    updates, are stored in half precision (half the bytes; the arithmetic stays f32).
    """
    t0 = time.perf_counter()
    step = progress or (lambda name: None)
    pb = PackageBuilder(__version__, share_scratch)
    pb.reservation = Reservation(estimated_package_bytes(model))  # its pages are touched meanwhile
    step("forward graph")
    fwd = prepare(model.graph)
    meta = {"source": source or {}, "batch": _batch_info(model)}
    tg = None
    if train is not None:
        step("autodiff and optimizer")
        tg = prepare(build_training_graph(model.graph, train))
    _weights_as([fwd] if tg is None else [fwd, tg], weights)
    # both graphs fix the weights: hash them on a thread while the rest is scheduled
    pb.start_blob_hash([fwd] if tg is None else [fwd, tg])
    if tg is not None:
        pb.plan_arenas([tg])  # before inference places the parameters
    step("schedule inference")
    pb.add_program("infer", schedule(fwd))
    if tg is not None:
        step("schedule training step")
        pb.add_program("train_step", schedule(tg), {"row_mask": ROW_MASK})
        meta["training"] = {"loss": train.loss, "optimizer": train.optimizer, "lr": train.lr,
                            "frozen": sorted(tg.frozen), "row_mask": ROW_MASK}
    step("write package")
    meta["compile_seconds"] = round(time.perf_counter() - t0, 4)
    return pb.write(meta)


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
                     weights: str = "f32") -> bytes:
    """Compile several graphs into one package, one program each (name -> Graph).

    Parameters, optimizer state and inputs with the same name share one buffer across
    programs; a program can hand a tensor to another through a state it assigns (e.g. an
    inference program caching features that a training program reads). `weights`: as
    compile_model's."""
    if "infer" not in programs:
        raise ValueError("a package needs an 'infer' program")
    pb = PackageBuilder(__version__)
    prepared = {name: prepare(graph) for name, graph in programs.items()}
    _weights_as(prepared.values(), weights)
    pb.start_blob_hash(prepared.values())
    pb.plan_arenas(prepared.values())
    for name, g in prepared.items():
        pb.add_program(name, schedule(g), {"row_mask": ROW_MASK} if ROW_MASK in g.inputs else None)
    return pb.write({"source": source or {}, "batch": None, **(meta or {})})


def compile_graph(graph, program: str = "infer") -> bytes:
    """Compile a raw Graph (any outputs, e.g. gradients made with autodiff.gradients)
    into a package whose one program runs it. Used by tests and tools."""
    pb = PackageBuilder(__version__)
    pb.add_program(program, schedule(prepare(graph)))
    if program != "infer":
        pb.add_program("infer", schedule(prepare(graph)))
    return pb.write({"source": {"kind": "graph"}, "batch": None})

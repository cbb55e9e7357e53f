"""PyTorch's fast paths for a workload's torch side (workloads.TorchSide), timed by
bench/run.py --fast-paths beside its fp32 eager baseline (TF32 off):

    tf32           TF32 matmuls and cuDNN convolutions (torch.backends.cuda.matmul.allow_tf32,
                   torch.backends.cudnn.allow_tf32), on while the path is made and timed, then
                   restored
    bf16_autocast  torch.autocast(dtype=torch.bfloat16) around the forward (and, training, the
                   loss; the backward and the AdamW step outside it; bf16 needs no GradScaler)
    compile        torch.compile (default mode, TF32 off) of the forward for inference; for
                   training, of the whole step function (zero_grad, forward, loss, backward,
                   AdamW step: "compiled": "step"), or where that fails, of the forward with
                   eager backward and optimizer ("compiled": "forward", its "step_error")
    cuda_graph     inference on CUDA only: the eager forward captured in a CUDA graph and
                   replayed (the inputs stay in the same tensors)

Each path is made and called (made_s: torch.compile compiles on its first calls, so a compiled
path is called twice, a recompile on the second call counted too); its output (inference) or
the loss its first step returns (computed before that step's update) is compared with fp32
eager at the same weights (rel_err: max |path - fp32| / max |fp32|; training paths also give
that fp32 loss, fp32_loss: after the timed loops before it, it can be small); then it is timed
as the baseline is. A path that fails is {"error": "Type: message"} and the others go on; one that
does not apply is {"skipped": why}.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np

PATHS = {"infer": ("tf32", "bf16_autocast", "compile", "cuda_graph"),
         "train_step": ("tf32", "bf16_autocast", "compile")}


@contextlib.contextmanager
def tf32(on: bool):
    """TF32 for CUDA matmuls and cuDNN convolutions on (or off) inside, as it was after."""
    import torch

    was = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = was


def error_text(exc) -> str:
    """An exception as one line for a results row: its type and the start of its message."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def _numpy(t):
    return t.detach().float().cpu().numpy()


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _bf16(dev):
    import torch

    return torch.autocast("cpu" if dev == "cpu" else "cuda", dtype=torch.bfloat16)


def _step(side, forward, autocast=None):
    """A training step from the side's pieces: zero_grad, forward and loss (under autocast()
    when given), backward, optimizer step; returns the loss."""

    def step():
        side.optimizer.zero_grad(set_to_none=True)
        loss = side.loss(forward())
        loss.backward()
        side.optimizer.step()
        return loss

    def step_autocast():
        side.optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = side.loss(forward())
        loss.backward()
        side.optimizer.step()
        return loss
    return step if autocast is None else step_autocast


def _in_mode(side, training, fn):
    def call():
        side.set_mode(training)
        return fn()
    return call


def _make_infer(name, side, dev, ref, reference):
    """(infer fn to time, its first output's rel err against `ref`, details)."""
    import torch

    infer = side[0]
    if name == "tf32":
        return infer, _rel(_numpy(infer()), ref), {}
    if name == "bf16_autocast":
        def fn():
            with _bf16(dev):
                return infer()
        return fn, _rel(_numpy(fn()), ref), {}
    if name == "compile":
        compiled = torch.compile(side.forward)

        def fn():
            side.set_mode(False)
            with torch.no_grad():
                return compiled()
        fn()
        return fn, _rel(_numpy(fn()), ref), {}
    if name == "cuda_graph":  # warmed up on a side stream, as torch.cuda.graph asks
        infer()
        side_stream = torch.cuda.Stream()
        side_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side_stream):
            for _ in range(3):
                infer()
        torch.cuda.current_stream().wait_stream(side_stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = infer()
        graph.replay()
        return graph.replay, _rel(_numpy(out), ref), {}
    raise ValueError(name)


def _make_train(name, side, dev, ref, reference, compile_step=True):
    """(training step fn to time, the loss of its first step's rel err against `ref`, details)."""
    import torch

    if name == "tf32":
        return side[1], _rel(_numpy(side[1]()), ref), {}
    if name == "bf16_autocast":
        fn = _in_mode(side, True, _step(side, side.forward, lambda: _bf16(dev)))
        return fn, _rel(_numpy(fn()), ref), {}
    if name == "compile":
        details = {"compiled": "forward"}
        if compile_step:
            fn = _in_mode(side, True, torch.compile(_step(side, side.forward)))
            try:
                first = fn()
                fn()
                return fn, _rel(_numpy(first), ref), {"compiled": "step"}
            except Exception as exc:  # noqa: BLE001  (then the forward alone, backward and AdamW eager)
                details["step_error"] = error_text(exc)
            ref = reference()  # the failed step may have updated the weights
            details["fp32_loss"] = float(np.asarray(ref).reshape(-1)[0])
        fn = _in_mode(side, True, _step(side, torch.compile(side.forward)))
        first = fn()
        fn()
        return fn, _rel(_numpy(first), ref), details
    raise ValueError(name)


def run_paths(side, program: str, dev: str, time_fn, compile: bool = True, compile_step: bool = True) -> dict:
    """{path: {gpu_ms, wall_ms, iters, made_s, rel_err, ...} | {error} | {skipped}} for
    `program` ("infer" or "train_step") of `side`; time_fn(fn) times one (timing.time_torch).
    compile: torch.compile at all; compile_step: of the whole training step (else of its forward)."""
    import torch

    def reference():  # fp32 eager (TF32 off) at the weights as they are now
        if program == "infer":
            return _numpy(side[0]())
        side.set_mode(True)
        with torch.no_grad():
            return _numpy(side.loss(side.forward()))

    def make(name, side, dev, ref, reference):
        if program == "infer":
            return _make_infer(name, side, dev, ref, reference)
        return _make_train(name, side, dev, ref, reference, compile_step)
    out = {}
    for name in PATHS[program]:
        if name == "cuda_graph" and dev == "cpu":
            out[name] = {"skipped": "needs CUDA"}
            continue
        if name == "compile" and not compile:
            out[name] = {"skipped": "--no-compile"}
            continue
        if (name == "compile" and side.forward is None) or (program == "train_step" and (
                side.forward is None or side.loss is None or side.optimizer is None)):
            out[name] = {"skipped": "the torch side gives no forward / loss / optimizer to rebuild it from"}
            continue
        try:
            ref = reference()
            with tf32(name == "tf32"):
                t = time.perf_counter()
                fn, rel_err, details = make(name, side, dev, ref, reference)
                if dev != "cpu":
                    torch.cuda.synchronize()
                made_s = time.perf_counter() - t
                out[name] = {**time_fn(fn), "made_s": made_s, "rel_err": rel_err, **details}
                if program == "train_step":  # the loss rel_err is relative to (late in a run it can be small)
                    out[name].setdefault("fp32_loss", float(np.asarray(ref).reshape(-1)[0]))
        except Exception as exc:  # noqa: BLE001  (one path failing must not hide the others)
            out[name] = {"error": error_text(exc)}
    return out

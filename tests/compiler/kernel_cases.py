"""Small models shared by the kernel-variant tests: each with its inputs and a reference answer."""
from __future__ import annotations

import numpy as np
from meganeura.compiler import Builder
from meganeura.compiler.ir.autodiff import gradients


def conv_with_gradients(xs, ws, stride, seed, w_scale=1.0):
    """A padded 3x3 convolution with the gradients of sum(y * ct) w.r.t. x and w: the model,
    its inputs, and torch's answers."""
    import torch

    rng = np.random.default_rng(seed)
    b = Builder()
    x, w = b.input("x", xs), b.input("w", ws)
    y = b.conv2d(x, w, stride=(stride, stride), padding=(1, 1, 1, 1))
    ct = b.input("ct", y.shape)
    g = gradients(b.e, b.sum(y * ct).id, [x.id, w.id])
    b.output("y", y)
    b.g.outputs.update(gx=g[x.id], gw=g[w.id])
    vals = {"x": rng.standard_normal(xs), "w": rng.standard_normal(ws) * w_scale, "ct": rng.standard_normal(y.shape)}
    tx, tw = torch.tensor(vals["x"], requires_grad=True), torch.tensor(vals["w"], requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, stride=stride, padding=1)
    (ty * torch.tensor(vals["ct"])).sum().backward()
    return b.build(), vals, {"y": ty.detach().numpy(), "gx": tx.grad.numpy(), "gw": tw.grad.numpy()}


def matmul_case(sa, sb, ta=False, tb=False, seed=0):
    """A one-matmul model, its inputs and numpy's answer."""
    rng = np.random.default_rng(seed)
    b = Builder()
    b.output("c", b.matmul(b.input("a", sa), b.input("b", sb), trans_a=ta, trans_b=tb))
    vals = {"a": rng.standard_normal(sa), "b": rng.standard_normal(sb)}
    refs = {"c": np.matmul(np.swapaxes(vals["a"], -1, -2) if ta else vals["a"],
                           np.swapaxes(vals["b"], -1, -2) if tb else vals["b"])}
    return b.build(), vals, refs


def assert_close(got, refs, tol=1e-4):
    for k, ref in refs.items():
        assert np.abs(got[k] - ref).max() / np.abs(ref).max() < tol, k


class _Held:
    """A tuned tier that never comes: a quick_start Session stays on its quick tier."""

    error = None

    def __init__(self, *args):
        pass

    def wait(self, timeout=None):
        raise TimeoutError("held")

    def cancel(self):
        pass


def session(device, pkg, variant: str):
    """A Session running `variant`'s kernels: "cpu" or "gpu" (device classes), or "quick" (the
    GPU's quick tier, held there: its tuned kernels never replace it)."""
    from meganeura.runtime import Session
    from meganeura.runtime import session as session_module

    if variant != "quick":
        return Session(device, pkg, device_class=variant)
    real, session_module.TunedTier = session_module.TunedTier, _Held
    try:
        s = Session(device, pkg, device_class="gpu", quick_start=True)
    finally:
        session_module.TunedTier = real
    quick = any("quick" in d.get("variants", {}) for p in pkg.programs.values() for d in p["dispatches"])
    assert s.tier == ("quick" if quick else "tuned")  # (fused attention of heads under 68 wide has no quick variant)
    return s

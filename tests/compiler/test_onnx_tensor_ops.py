"""ONNX tensor and neural-network ops built from gathers, scatters and interpolation weights:
Pad (reflect, edge, wrap), Resize (antialias, exclude_outside, tf_crop_and_resize,
half_pixel_symmetric), ReverseSequence, Compress, TensorScatter, MaxPool's Indices,
MaxUnpool, RoiAlign, DeformConv, and integer Trilu / CumSum / GatherND / OneHot / MaxPool.

One-node models imported, differentiated with respect to their float inputs, and compared
on full tensors with torch autograd in float64 (the interpreter, 1e-9; torch has no RoiAlign
or DeformConv here, so those references are written below in torch) and, for some, the
GPU (1e-4). Resize modes torch lacks are checked against the ONNX reference evaluator in
float64, their gradients against its Jacobian (Resize is linear in its input)."""
import itertools
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from meganeura.compiler import Builder, run_graph
from meganeura.compiler.ir.autodiff import gradients
from meganeura.compiler.onnx_import import load_onnx
from onnx import TensorProto, helper, numpy_helper

TYPES = {"f": TensorProto.FLOAT, "i": TensorProto.INT64, "d": TensorProto.DOUBLE, "u": TensorProto.UINT8}


def _model(op, feed, attrs, consts=(), opset=22, outs=("y",), dtype="f", out_type=TensorProto.FLOAT):
    """A one-node model: inputs named as `feed` (float arrays of `dtype`, integers as int64
    unless `dtype` is "u" or "i32"), constants as initializers."""
    def kind(v):
        if v.dtype.kind == "f":
            return TYPES[dtype if dtype in "fd" else "f"]
        return TensorProto.INT32 if dtype == "i32" else TYPES["u" if dtype == "u" else "i"]
    inputs = [helper.make_tensor_value_info(k, kind(v), v.shape) for k, v in feed.items()]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(consts).items()]
    order = attrs.pop("_order", list(feed) + [k for k, _ in consts])
    node = helper.make_node(op, order, list(outs), **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(o, out_type, None) for o in outs],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _graph_with_grads(model, feed):
    """(graph with outputs y and grad_<input> of sum(y * ct), inputs with ct, float input names)."""
    b = Builder.extend(load_onnx(model))
    y = b.outputs["y"]
    wrt = [k for k, v in feed.items() if v.dtype.kind == "f"]
    ids = [b.g.named[("input", k)] for k in wrt]
    ct = b.input("ct", y.shape)
    grads = gradients(b.e, b.sum(y * ct).id, ids)
    for k, i in zip(wrt, ids):
        if i in grads:
            b.g.outputs[f"grad_{k}"] = grads[i]
    rng = np.random.default_rng(len(feed) + int(np.prod(y.shape)))
    return b.g, {**feed, "ct": rng.standard_normal(y.shape).astype(np.float32).astype(np.float64)}, wrt


def _torch(fn, feed, ct, wrt):
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=k in wrt) if v.dtype.kind == "f"
         else torch.tensor(v.astype(np.int64)) for k, v in feed.items()}
    y = fn(**t)
    grads = torch.autograd.grad((y * torch.tensor(ct)).sum(), [t[k] for k in wrt])
    return {"y": y.detach().numpy(), **{f"grad_{k}": g.numpy() for k, g in zip(wrt, grads)}}


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _compare(g, vals, ref, run_on_gpu=None, tol=1e-9):
    got = run_graph(g, vals, np.float64)[0]
    for k in set(ref) - set(got):
        assert not ref[k].any(), f"{k}: no gradient, the reference's is not zero"
        del ref[k]
    assert set(got) == set(ref)
    for k in ref:
        assert _rel(got[k], ref[k]) < tol, f"{k}: interpreter vs reference"
    if run_on_gpu is not None:
        gpu = run_on_gpu(g, vals)
        for k in ref:
            assert _rel(gpu[k], ref[k]) < 1e-4, f"{k}: GPU vs reference"


def _check(model, feed, fn, run_on_gpu=None):
    g, vals, wrt = _graph_with_grads(model, feed)
    _compare(g, vals, _torch(fn, feed, vals["ct"], wrt), run_on_gpu)


def _f(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32).astype(np.float64)


R = np.random.default_rng(7)


@pytest.mark.parametrize("mode,torch_mode", [("reflect", "reflect"), ("edge", "replicate"), ("wrap", "circular")])
def test_pad_modes_against_torch(mode, torch_mode, run_on_gpu):
    feed = {"x": _f(R, 2, 3, 4, 5)}
    pads = np.array([0, 0, 1, 2, 0, 0, 2, 1])
    model = _model("Pad", feed, {"mode": mode, "_order": ["x", "pads"]}, [("pads", pads)], opset=19)
    _check(model, feed, lambda x: F.pad(x, (2, 1, 1, 2), torch_mode), run_on_gpu if mode == "wrap" else None)


@pytest.mark.parametrize("mode,size", [("linear", (4, 5)), ("cubic", (3, 7))])
def test_resize_antialias_against_torch(mode, size, run_on_gpu):
    """Antialias with exclude_outside (and a = -0.5 for cubic) is torch's antialiased interpolate."""
    feed = {"x": _f(R, 2, 3, 9, 11)}
    at = {"mode": mode, "antialias": 1, "exclude_outside": 1, "cubic_coeff_a": -0.5, "_order": ["x", "", "", "sizes"]}
    model = _model("Resize", feed, at, [("sizes", np.array((2, 3) + size))], opset=19)
    _check(model, feed, lambda x: F.interpolate(x, size=size, mode="bilinear" if mode == "linear" else "bicubic",
                                                antialias=True, align_corners=False),
           run_on_gpu if mode == "cubic" else None)


def _onnx_reference(model_double, feed):
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(model_double).run(None, feed)[0]


RESIZES = [  # (attributes, roi, scales or sizes)
    ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 3.0},
     np.array([0, 0, 0.2, -0.3, 1, 1, 1.1, 0.9]), ("sizes", np.array([1, 2, 4, 5]))),
    ({"mode": "cubic", "coordinate_transformation_mode": "tf_crop_and_resize", "axes": [3, 2]},
     np.array([0.1, 0.3, 0.8, 0.7]), ("sizes", np.array([6, 3]))),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}, None,
     ("scales", np.array([1, 1, 1.7, 0.6], np.float32))),
    ({"mode": "cubic", "antialias": 1}, None, ("scales", np.array([1, 1, 0.6, 0.5], np.float32))),
    ({"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, None, ("scales", np.array([1, 1, 2, 1.5],
                                                                                             np.float32))),
    ({"mode": "nearest", "coordinate_transformation_mode": "half_pixel_symmetric", "nearest_mode": "ceil"}, None,
     ("sizes", np.array([1, 2, 7, 3]))),
]


@pytest.mark.parametrize("case", range(len(RESIZES)))
def test_resize_modes_against_the_onnx_reference(case):
    at, roi, (kind, value) = RESIZES[case]
    x = _f(np.random.default_rng(case), 1, 2, 4, 5)
    consts = ([("roi", roi.astype(np.float32))] if roi is not None else []) + [(kind, value)]
    order = ["x", "roi" if roi is not None else "", "scales" if kind == "scales" else ""] + (
        ["sizes"] if kind == "sizes" else [])
    model = _model("Resize", {"x": x}, dict(at, _order=order), consts, opset=19)
    g, vals, _ = _graph_with_grads(model, {"x": x})
    dconsts = [(k, v.astype(np.float64) if v.dtype == np.float32 and k == "roi" else v) for k, v in consts]
    ref_model = _model("Resize", {"x": x}, dict(at, _order=order), dconsts, opset=19, dtype="d",
                       out_type=TensorProto.DOUBLE)
    y = _onnx_reference(ref_model, {"x": x})
    base = _onnx_reference(ref_model, {"x": np.zeros_like(x)})  # the extrapolated constant
    jac = np.stack([(_onnx_reference(ref_model, {"x": e.reshape(x.shape)}) - base).reshape(-1)
                    for e in np.eye(x.size)], 1)
    # (the reference computes cubic weights in float32: its coefficient a is a float32 attribute)
    _compare(g, vals, {"y": y, "grad_x": (jac.T @ vals["ct"].reshape(-1)).reshape(x.shape)},
             tol=1e-5 if at["mode"] == "cubic" else 1e-9)


def test_reverse_sequence_with_known_and_computed_lengths(run_on_gpu):
    x = _f(R, 3, 4, 2)  # [time, batch, feature]
    lens = np.array([1, 3, 0, 2])

    def fn(x, lens=lens):
        rows = [torch.cat([x[:n, b].flip(0), x[n:, b]]) if n else x[:, b] for b, n in enumerate(lens)]
        return torch.stack(rows, 1)
    _check(_model("ReverseSequence", {"x": x}, {"_order": ["x", "l"]}, [("l", lens)]), {"x": x}, fn)
    feed = {"x": x, "l": lens}
    _check(_model("ReverseSequence", feed, {}), feed, lambda x, l: fn(x), run_on_gpu)
    xb = _f(R, 2, 5)  # [batch, time]
    feed = {"x": xb, "l": np.array([5, 2])}
    _check(_model("ReverseSequence", feed, {"batch_axis": 0, "time_axis": 1}), feed,
           lambda x, l: torch.stack([x[0].flip(0), torch.cat([x[1, :2].flip(0), x[1, 2:]])]))


def test_compress_gathers_where_the_condition_holds():
    x = _f(R, 3, 4)
    for axis, cond in ((1, [1, 0, 1, 1]), (0, [0, 1]), (None, [0, 1, 0, 0, 1, 1, 0, 1])):
        at = {"_order": ["x", "c"]} if axis is None else {"axis": axis, "_order": ["x", "c"]}
        ids = torch.tensor(np.flatnonzero(cond))
        _check(_model("Compress", {"x": x}, at, [("c", np.array(cond, bool))]), {"x": x},
               lambda x, axis=axis, ids=ids: x.reshape(-1)[ids] if axis is None else x.index_select(axis, ids))
    feed = {"x": x, "c": np.array([1, 0, 1])}
    with pytest.raises(NotImplementedError, match=r"\('c'\) must be a constant"):
        load_onnx(_model("Compress", feed, {"axis": 0}))


@pytest.mark.parametrize("mode,known", [("linear", True), ("linear", False), ("circular", False)])
def test_tensor_scatter_against_torch(mode, known, run_on_gpu):
    cache, upd, wi = _f(R, 2, 3, 5, 4), _f(R, 2, 3, 2, 4), np.array([3, 1] if mode == "linear" else [4, 2])

    def fn(past, update, wi=wi):
        out = past.clone()
        for b in range(2):
            for s in range(2):
                out[b, :, (wi[b] + s) % 5] = update[b, :, s]
        return out
    if known:
        feed = {"past": cache, "update": upd}
        model = _model("TensorScatter", feed, {"mode": mode, "_order": ["past", "update", "w"]}, [("w", wi)], opset=24)
        _check(model, feed, fn)
    else:
        feed = {"past": cache, "update": upd, "w": wi}
        _check(_model("TensorScatter", feed, {"mode": mode}, opset=24), feed, lambda past, update, w: fn(past, update),
               run_on_gpu if mode == "circular" else None)


def test_max_pool_indices_and_max_unpool_against_torch(run_on_gpu):
    x = _f(R, 2, 3, 6, 7)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = 9.0  # a tie: the first position wins
    for order in (0, 1):
        model = _model("MaxPool", {"x": x}, {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 0],
                                             "storage_order": order}, outs=("y", "i"))
        model.graph.output[1].type.tensor_type.elem_type = TensorProto.INT64
        g = load_onnx(model).graph
        got = run_on_gpu(g, {"x": x.astype(np.float32)}) if order == 0 else run_graph(g, {"x": x}, np.float64)[0]
        y, idx = F.max_pool2d(torch.tensor(x), (3, 2), (2, 2), (1, 0), return_indices=True)
        y, idx = y.numpy(), idx.numpy()
        h, w = np.divmod(idx, 7)
        flat = (np.arange(6).reshape(2, 3, 1, 1) * 42 + (h * 7 + w if order == 0 else h + w * 6))
        np.testing.assert_array_equal(got["i"], flat)
        assert _rel(got["y"], y) < 1e-6
    xt = _f(R, 2, 3, 3, 3)
    _, tidx = F.max_pool2d(torch.tensor(_f(R, 2, 3, 6, 6)), 2, 2, return_indices=True)
    feed = {"xt": xt, "xi": tidx.numpy() + np.arange(6).reshape(2, 3, 1, 1) * 36}
    _check(_model("MaxUnpool", feed, {"kernel_shape": [2, 2], "strides": [2, 2], "_order": ["xt", "xi", "shape"]},
                  [("shape", np.array([2, 3, 7, 6]))]), feed,
           lambda xt, xi: F.pad(F.max_unpool2d(xt, tidx, 2, 2), (0, 0, 0, 1)), run_on_gpu)


def _bilinear_zeros(img, y, x):
    """img [C, H, W] at (y, x) (tensors of one shape), corners outside read as 0."""
    h, w = img.shape[1:]
    y0, x0 = torch.floor(y), torch.floor(x)
    out = 0.0
    for dy, dx in itertools.product((0, 1), (0, 1)):
        yi, xi = y0 + dy, x0 + dx
        wt = (1 - (y - yi).abs()) * (1 - (x - xi).abs())
        ok = (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w)
        v = img[:, yi.clamp(0, h - 1).long(), xi.clamp(0, w - 1).long()]
        out = out + v * (wt * ok)
    return out


def _deform_conv_torch(X, W, offset, B, mask, stride, pad, dil, group, og):
    n, c = X.shape[:2]
    oc, cg, kh, kw = W.shape
    oh, ow = offset.shape[2:]
    oy = torch.arange(oh, dtype=X.dtype)[:, None] * stride[0] - pad[0]
    ox = torch.arange(ow, dtype=X.dtype)[None, :] * stride[1] - pad[1]
    cpo = c // og
    cols = []
    for b in range(n):
        per_c = []
        for ch in range(c):
            g = ch // cpo
            taps = []
            for k in range(kh * kw):
                i, j = divmod(k, kw)
                y = oy + i * dil[0] + offset[b, g * 2 * kh * kw + 2 * k]
                x = ox + j * dil[1] + offset[b, g * 2 * kh * kw + 2 * k + 1]
                taps.append(_bilinear_zeros(X[b, ch:ch + 1], y, x)[0] * mask[b, g * kh * kw + k])
            per_c.append(torch.stack(taps))
        cols.append(torch.stack(per_c))  # [C, K, oh, ow]
    cols = torch.stack(cols)
    outs = []
    for gi in range(group):
        cc = cols[:, gi * cg:(gi + 1) * cg].reshape(n, cg * kh * kw, oh * ow)
        wg = W[gi * (oc // group):(gi + 1) * (oc // group)].reshape(oc // group, -1)
        outs.append(torch.einsum("ok,nkp->nop", wg, cc))
    return torch.cat(outs, 1).reshape(n, oc, oh, ow) + B.reshape(1, -1, 1, 1)


def test_deform_conv_against_a_torch_reference(run_on_gpu):
    rng = np.random.default_rng(zlib.crc32(b"deform"))
    n, c, h, w, oc, group, og, kh, kw = 2, 4, 5, 6, 4, 2, 2, 2, 3
    stride, pad, dil = (1, 2), (1, 1, 0, 1), (2, 1)
    oh = (h + pad[0] + pad[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + pad[1] + pad[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    feed = {"X": _f(rng, n, c, h, w), "W": _f(rng, oc, c // group, kh, kw),
            "offset": rng.uniform(-2.2, 2.2, (n, og * 2 * kh * kw, oh, ow)), "B": _f(rng, oc),
            "mask": rng.uniform(0, 1, (n, og * kh * kw, oh, ow))}
    at = {"kernel_shape": [kh, kw], "strides": list(stride), "pads": list(pad), "dilations": list(dil),
          "group": group, "offset_group": og}
    _check(_model("DeformConv", feed, at), feed,
           lambda X, W, offset, B, mask: _deform_conv_torch(X, W, offset, B, mask, stride, pad, dil, group, og),
           run_on_gpu)


def _roi_align_torch(X, rois, batch, oh, ow, ratio, scale, half, mode):
    h, w = X.shape[2:]
    out = []
    for r, (x1, y1, x2, y2) in enumerate(rois.tolist()):
        off = 0.5 if half else 0.0
        x1, y1, x2, y2 = x1 * scale - off, y1 * scale - off, x2 * scale - off, y2 * scale - off
        rh, rw = (y2 - y1, x2 - x1) if half else (max(y2 - y1, 1.0), max(x2 - x1, 1.0))
        gh, gw = ratio or int(np.ceil(rh / oh)), ratio or int(np.ceil(rw / ow))
        img, bins = X[int(batch[r])], []
        for ph, pw in itertools.product(range(oh), range(ow)):
            vals = []
            for iy, ix in itertools.product(range(gh), range(gw)):
                y = y1 + ph * rh / oh + (iy + 0.5) * rh / oh / gh
                x = x1 + pw * rw / ow + (ix + 0.5) * rw / ow / gw
                if y < -1 or y > h or x < -1 or x > w:
                    vals.append(torch.zeros(X.shape[1], 4, dtype=X.dtype))
                    continue
                y, x = min(max(y, 0.0), h - 1), min(max(x, 0.0), w - 1)
                yl, xl = int(y), int(x)
                yh, xh = min(yl + 1, h - 1), min(xl + 1, w - 1)
                ly, lx = y - yl, x - xl
                vals.append(torch.stack([img[:, yl, xl] * (1 - ly) * (1 - lx), img[:, yl, xh] * (1 - ly) * lx,
                                         img[:, yh, xl] * ly * (1 - lx), img[:, yh, xh] * ly * lx], 1))
            v = torch.stack(vals)  # [S, C, 4]
            bins.append(v.sum((0, 2)) / len(vals) if mode == "avg" else v.amax(2).amax(0))
        out.append(torch.stack(bins, 1).reshape(-1, oh, ow))
    return torch.stack(out)


@pytest.mark.parametrize("mode,half,ratio", [("avg", True, 2), ("avg", False, 0), ("max", True, 0)])
def test_roi_align_against_a_torch_reference(mode, half, ratio, run_on_gpu):
    x = _f(R, 2, 3, 7, 8)
    x[1, 0, 2, 3] = 5.0  # a clear maximum (max mode's gradient goes to one sample)
    rois = np.array([[0.5, 1.0, 6.0, 5.5], [2.2, 0.1, 4.1, 3.3], [-0.8, 3.0, 9.0, 8.5]])
    batch = np.array([1, 0, 1])
    at = {"mode": mode, "output_height": 3, "output_width": 2, "sampling_ratio": ratio, "spatial_scale": 0.9,
          "coordinate_transformation_mode": "half_pixel" if half else "output_half_pixel", "_order": ["x", "r", "b"]}
    model = _model("RoiAlign", {"x": x}, at, [("r", rois.astype(np.float32)), ("b", batch)])
    _check(model, {"x": x}, lambda x: _roi_align_torch(x, rois.astype(np.float32).astype(float), batch, 3, 2, ratio,
                                                       float(np.float32(0.9)), half, mode), run_on_gpu if mode == "max" else None)


def test_integer_ops_are_exact_on_the_gpu(run_on_gpu):
    """Trilu, CumSum, GatherND, OneHot values and MaxPool on int32 tensors: exact (values
    beyond float32's 2^24)."""
    x = (np.arange(2 * 4 * 5, dtype=np.int64).reshape(2, 4, 5) * 3_000_017 - 60_000_000).astype(np.int32)
    cases = [("Trilu", {"x": x}, {"upper": 0, "_order": ["x", "k"]}, [("k", np.array(1))],
              np.stack([np.tril(m, 1) for m in x])),
             ("CumSum", {"x": x}, {"exclusive": 1, "_order": ["x", "a"]}, [("a", np.array(2))],
              np.cumsum(x, 2, dtype=np.int32) - x),
             ("GatherND", {"x": x}, {"batch_dims": 1, "_order": ["x", "i"]}, [("i", np.array([[[3], [0]], [[1], [1]]]))],
              np.stack([x[0, [3, 0]], x[1, [1, 1]]])),
             ("MaxPool", {"x": x[:, None]}, {"kernel_shape": [2, 3], "pads": [1, 1, 0, 1]}, [],
              np.maximum.reduce([np.pad(x[:, None], ((0, 0),) * 2 + ((1, 0), (1, 1)), constant_values=-2 ** 31)
                                 [:, :, i:i + 4, j:j + 5] for i in range(2) for j in range(3)])),
             ("OneHot", {"i": np.array([2, -1, 0], np.int32), "v": np.array([-7, 16_777_217], np.int32)},
              {"_order": ["i", "d", "v"]}, [("d", np.array(3))], np.where(np.eye(3)[[2, 2, 0]] == 1, 16_777_217, -7))]
    for op, feed, at, consts, want in cases:
        model = _model(op, feed, at, consts, dtype="i32", out_type=TensorProto.INT32)
        g = load_onnx(model).graph
        np.testing.assert_array_equal(run_graph(g, feed, np.float64)[0]["y"], want, err_msg=op)
        np.testing.assert_array_equal(run_on_gpu(g, feed)["y"], want, err_msg=op)

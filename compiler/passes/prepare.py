"""Rewrites that run before scheduling, each keeping the interpreter's answer.

Decompositions, reductions over scattered axes, pointwise convolutions as matmuls, common
subexpressions and dead nodes. Tests check interpreter(before) == interpreter(after) on
random inputs.
"""
from __future__ import annotations


from ..ir.emit import Emitter
from ..ir.graph import Graph, Node, make_attrs
from ..ir.ops import OPS
from ..ir.ops_layers import attention_fits_fused
from ..options import DEFAULT, CompileOptions
from .reductions import reduce_geometry


def prepare(graph: Graph, options: CompileOptions = DEFAULT) -> Graph:
    """A new graph holding only ops that have kernels, views, or leaves."""
    out = Graph(values=dict(graph.values), frozen=set(graph.frozen), arenas=graph.arenas,
                io_dtypes=dict(graph.io_dtypes))
    e = Emitter(out)
    remap = {}
    raw_add = out.add
    seen = {}  # (op, dtype, shape, inputs, attrs) -> new id: common subexpressions

    def add(node: Node) -> int:
        # rewrites apply to every node, also those that other rewrites emit
        low = OPS[node.op].lowering
        if low[0] == "decompose":
            return low[1](e, node)
        if node.op == "attention" and not attention_fits_fused(node, out):
            return low[2](e, node)
        if node.op in ("reduce_sum", "reduce_max") and \
                reduce_geometry(out.nodes[node.inputs[0]].shape, node.attr("axes")) is None:
            return _split_reduce(e, node, node.inputs[0])
        if options.pointwise_conv_as_matmul and node.op in ("conv2d", "conv_transpose2d") and _pointwise(node, out):
            return _pointwise_as_matmul(e, node)
        key = (node.op, node.dtype, node.shape, node.inputs, node.attrs)
        if node.op in ("input", "param", "state", "constant"):
            key = (node.op, node.attr("name"))
        if key not in seen:
            seen[key] = raw_add(node)
        return seen[key]

    out.add = add  # route every emitted node through CSE
    try:
        for i in graph.live_nodes():
            n = graph.nodes[i]
            ins = tuple(remap[j] for j in n.inputs)
            if n.op == "reshape" and out.nodes[ins[0]].shape == n.shape:
                remap[i] = ins[0]
            elif n.op == "const":
                remap[i] = e.const(n.attr("value"), n.dtype)
            else:
                remap[i] = add(Node(n.op, n.dtype, n.shape, ins, n.attrs))
    finally:
        del out.add
    out.outputs = {k: remap[i] for k, i in graph.outputs.items()}
    out.assigns = {}
    for k, i in graph.assigns.items():
        # an assign is an elementwise kernel writing into the target's buffer; anything
        # else (a matmul result, a leaf, an output) goes through a copy
        v = remap[i]
        b = v
        while out.nodes[b].op == "reshape":
            b = out.nodes[b].inputs[0]
        if OPS[out.nodes[b].op].lowering[0] != "elementwise" or b in out.outputs.values() \
                or b in out.assigns.values():
            v = raw_add(Node("broadcast_to", out.nodes[v].dtype, out.nodes[v].shape, (v,),
                             make_attrs(shape=out.nodes[v].shape)))
        out.assigns[k] = v
    # leaves that the program never reads still exist for the package (a frozen weight)
    for i, n in enumerate(graph.nodes):
        if n.op in ("input", "param", "state", "constant") and i not in remap:
            add(n)
    return out


def _pointwise(n: Node, g: Graph) -> bool:
    """A 1x1 convolution with stride 1, no padding and one group (half of ResNet-50's): its
    operands are plain matrices, read 16 bytes at a time as a matmul's."""
    w = g.nodes[n.inputs[1]].shape
    return (w[2:] == (1, 1) and tuple(n.attr("stride", (1, 1))) == (1, 1) and not any(n.attr("padding", ()))
            and n.attr("groups", 1) == 1 and not any(n.attr("output_padding", ())))


def _pointwise_as_matmul(e: Emitter, n: Node) -> int:
    """conv2d: y[n] = W x[n] with W [out, in]; conv_transpose2d (a conv2d's input gradient):
    y[n] = W^T x[n] with W [in, out] as stored."""
    x, w = n.inputs
    (b, c, h, wd), ws = e.shape(x), e.shape(w)
    y = e.op("matmul", e.reshape(w, ws[:2]), e.reshape(x, (b, c, h * wd)), trans_a=n.op == "conv_transpose2d")
    return e.reshape(y, n.shape)


def _split_reduce(e: Emitter, n: Node, x: int) -> int:
    """A reduction over scattered axes that one kernel cannot walk (see reduce_geometry)
    becomes one reduction per run of adjacent axes."""
    rank = len(e.shape(x))
    axes = sorted(a % rank for a in n.attr("axes"))
    runs, cur = [], []
    for a in axes:
        if cur and a != cur[-1] + 1:
            runs.append(cur)
            cur = []
        cur.append(a)
    if cur:
        runs.append(cur)
    y = x
    for run in reversed(runs):  # reduce later axes first; keepdims keeps axis numbers valid
        y = e.op(n.op, y, axes=tuple(run), keepdims=True)
    if not runs:
        y = e.op("broadcast_to", x, shape=e.shape(x))
    return e.reshape(y, n.shape)

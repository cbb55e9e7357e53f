"""WGSL for convolutions (implicit GEMM), pooling and gathers.

Convolutions never build an im2col matrix: the implicit-GEMM template's load functions
compute, for each (row, column) of the virtual matrix, which input element it is.
  forward          C[co, (n,oy,ox)]  = W[co, (ci,ky,kx)] . X[(ci,ky,kx), (n,oy,ox)]
  input gradient   (= conv_transpose2d) gathers, for each input pixel, the outputs it fed;
                   strided ones run as one dense GEMM per output phase (_transposed_by_phase)
  weight gradient  C[co, (ci,ky,kx)] = dY[co, (n,oy,ox)] . X[(n,oy,ox), (ci,ky,kx)]
Groups are the GEMM's batch dimension.
"""
from __future__ import annotations

from ..ir.ops_nn import conv_attrs, pool_attrs
from ..passes.records import Kernel, Schedule, base_of
from .common import WG, Bindings, KernelCode, grid, per_output
from .gemm import igemm
from .wgsl import i32_literal as _i


def _split(var, names, dims):
    """WGSL lines unflattening `var` into named coordinates with sizes `dims`."""
    lines, rest = [], var
    for i, (name, d) in enumerate(zip(names, dims)):
        inner = 1
        for dd in dims[i + 1:]:
            inner *= dd
        lines.append(f"    let {name} = ({rest} / {inner}u) % {d}u;" if i else f"    let {name} = {rest} / {inner}u;")
    return "\n".join(lines)


def conv(sched: Schedule, k: Kernel) -> KernelCode:
    g = sched.graph
    r = k.roots[0]
    n = g.nodes[r]
    a, b = (g.nodes[i] for i in n.inputs)
    s, p, d, groups = conv_attrs(dict(n.attrs))
    if n.op in ("conv2d", "conv2d_weight_grad"):
        return _conv_with_input(sched, n, r, a, b, s, p, d, groups)
    # conv_transpose2d(gy, w): the data gradient of a strided convolution
    x, w = a.shape, b.shape  # x [N, Cin, H, W], w [Cin, Cout/g, kh, kw]
    if s != (1, 1) and d == (1, 1):
        return _transposed_by_phase(sched, n, r, x, w, s, p, groups)
    bind = Bindings(sched)
    bind.use(base_of(g, n.inputs[0]), own=True)
    bind.use(base_of(g, n.inputs[1]), own=True)
    bind.use(r, write=True, own=True)
    nb, cin, h, wd = x
    _, og, kh, kw = w
    cg = cin // groups
    ho, wo = n.shape[2], n.shape[3]
    cout = og * groups
    kk = cg * kh * kw
    weight = bind.element(base_of(g, n.inputs[1]), "b", f"((g * {cg}u + ci) * {og}u + m) * {kh * kw}u + r")
    load_a = "\n".join([_split("k", ["ci", "r"], [cg, kh * kw]), f"    return {weight};"])
    load_b = "\n".join([
        _split("k", ["ci", "ky", "kx"], [cg, kh, kw]), _split("n", ["nb", "oy", "ox"], [nb, ho, wo]),
        f"    let ty = i32(oy) + {_i(p[0])} - i32(ky * {d[0]}u);",
        f"    let tx = i32(ox) + {_i(p[1])} - i32(kx * {d[1]}u);",
        f"    if (ty < 0 || tx < 0 || ty % {_i(s[0])} != 0 || tx % {_i(s[1])} != 0) {{ return 0.0; }}",
        f"    let iy = ty / {_i(s[0])};",
        f"    let ix = tx / {_i(s[1])};",
        f"    if (iy >= {_i(h)} || ix >= {_i(wd)}) {{ return 0.0; }}",
        f"    return a[((nb * {cin}u + g * {cg}u + ci) * {h}u + u32(iy)) * {wd}u + u32(ix)];"])
    store = "\n".join([_split("n", ["nb", "pix"], [nb, ho * wo]),
                       f"    c[(nb * {cout}u + g * {og}u + m) * {ho * wo}u + pix] = v;"])
    return igemm(bind, og, nb * ho * wo, kk, groups, load_a, load_b, store, "conv_transpose2d", conv=True)


def _transposed_by_phase(sched, n, r, x, w, s, p, groups) -> list:
    """A strided convolution's data gradient as s_y * s_x dense GEMMs, one per output phase:
    the output pixels (oy + p) = phase (mod s) take exactly the taps ky = phase (mod s). Over
    all taps, 3 of 4 of a stride-2 kernel's reads would land between gy's pixels and read zeros
    (bench/REJECTED.md). A phase without taps is zeros."""
    g = sched.graph
    nb, cin, h, wd = x
    _, og, kh, kw = w
    cg, cout = cin // groups, og * groups
    ho, wo = n.shape[2], n.shape[3]
    codes = []
    for py in range(s[0]):
        for px in range(s[1]):
            oy0, ox0 = (py - p[0]) % s[0], (px - p[1]) % s[1]  # the phase's first output row, column
            ny, nx = len(range(oy0, ho, s[0])), len(range(ox0, wo, s[1]))
            ty, tx = len(range(py, kh, s[0])), len(range(px, kw, s[1]))  # its taps per axis
            if not ny or not nx:
                continue
            bind = Bindings(sched)
            pixel = [_split("n", ["nb", "my", "mx"], [nb, ny, nx]),
                     f"    let oy = {oy0}u + my * {s[0]}u;", f"    let ox = {ox0}u + mx * {s[1]}u;"]
            if not ty or not tx:
                out = bind.use(r, write=True, own=True)
                body = "\n".join([_split("idx", ["co", "n"], [cout, nb * ny * nx]),
                                   *pixel, f"    {out}[((nb * {cout}u + co) * {ho}u + oy) * {wo}u + ox] = 0.0;"])
                codes.append(_map_kernel(bind, cout * nb * ny * nx, body, "conv_transpose2d/zeros"))
                continue
            bind.use(base_of(g, n.inputs[0]), own=True)
            bind.use(base_of(g, n.inputs[1]), own=True)
            bind.use(r, write=True, own=True)
            weight = bind.element(base_of(g, n.inputs[1]), "b", f"((g * {cg}u + ci) * {og}u + m) * {kh * kw}u"
                                  f" + ({py}u + jy * {s[0]}u) * {kw}u + {px}u + jx * {s[1]}u")
            load_a = "\n".join([_split("k", ["ci", "jy", "jx"], [cg, ty, tx]), f"    return {weight};"])
            load_b = "\n".join([
                _split("k", ["ci", "jy", "jx"], [cg, ty, tx]), *pixel,
                f"    let iy = i32((oy + {p[0] - py + s[0] * kh}u) / {s[0]}u) - {_i(kh)} - i32(jy);",
                f"    let ix = i32((ox + {p[1] - px + s[1] * kw}u) / {s[1]}u) - {_i(kw)} - i32(jx);",
                f"    if (iy < 0 || iy >= {_i(h)} || ix < 0 || ix >= {_i(wd)}) {{ return 0.0; }}",
                f"    return a[((nb * {cin}u + g * {cg}u + ci) * {h}u + u32(iy)) * {wd}u + u32(ix)];"])
            store = "\n".join([*pixel, f"    c[((nb * {cout}u + g * {og}u + m) * {ho}u + oy) * {wo}u + ox] = v;"])
            out = igemm(bind, og, nb * ny * nx, cg * ty * tx, groups, load_a, load_b, store, "conv_transpose2d",
                        conv=True)
            codes.extend(out if isinstance(out, list) else [out])
    return codes


def _conv_with_input(sched, n, r, a, b, s, p, d, groups):
    """conv2d and its weight gradient: implicit GEMMs whose im2col loads read the input x
    (binding a); the weight (conv2d) or the output gradient (binding b); the result (c)."""
    g = sched.graph
    x, o_ = a.shape, b.shape
    nb, c, h, wd = x
    bind = Bindings(sched)
    x_id = base_of(g, n.inputs[0])
    bind.use(x_id, own=True)
    read_x = f"    return {bind.element(x_id, 'a', f'((nb * {c}u + g * {c // groups}u + ci) * {h}u + u32(iy)) * {wd}u + u32(ix)')};"
    bind.use(base_of(g, n.inputs[1]), own=True)
    bind.shared_from = 2
    bind.use(r, write=True, own=True)
    window = [  # the input pixel an output pixel and a tap read (zero in the padding)
        f"    let iy = i32(oy * {s[0]}u + ky * {d[0]}u) - {_i(p[0])};",
        f"    let ix = i32(ox * {s[1]}u + kx * {d[1]}u) - {_i(p[1])};",
        f"    if (iy < 0 || iy >= {_i(h)} || ix < 0 || ix >= {_i(wd)}) {{ return 0.0; }}", read_x]
    if n.op == "conv2d":  # x [N, C, H, W], w [O, C/g, kh, kw]
        o, cg, kh, kw = o_
        ho, wo = n.shape[2], n.shape[3]
        og = o // groups
        kk = cg * kh * kw
        weight = base_of(g, n.inputs[1])
        load_a = f"    return {bind.element(weight, 'b', f'(g * {og}u + m) * {kk}u + k')};"  # the weight: binding b
        load_b = "\n".join([_split("k", ["ci", "ky", "kx"], [cg, kh, kw]), _split("n", ["nb", "oy", "ox"], [nb, ho, wo]),
                            *window])
        store = "\n".join([_split("n", ["nb", "pix"], [nb, ho * wo]),
                           f"    c[(nb * {o}u + g * {og}u + m) * {ho * wo}u + pix] = v;"])
        return igemm(bind, og, nb * ho * wo, kk, groups, load_a, load_b, store, n.op,
                     k_contiguous=(True, False), conv=True)  # weights [O, C/g * kh * kw]
    # conv2d_weight_grad(x, gy) -> [O, C/g, kh, kw]
    _, o, ho, wo = o_
    kh, kw = n.attr("kernel")
    cg, og = c // groups, o // groups
    load_a = "\n".join([_split("k", ["nb", "pix"], [nb, ho * wo]),
                        f"    return b[(nb * {o}u + g * {og}u + m) * {ho * wo}u + pix];"])
    load_b = "\n".join([_split("k", ["nb", "oy", "ox"], [nb, ho, wo]), _split("n", ["ci", "ky", "kx"], [cg, kh, kw]),
                        *window])
    store = f"    c[(g * {og}u + m) * {cg * kh * kw}u + n] = v;"
    return igemm(bind, og, cg * kh * kw, nb * ho * wo, groups, load_a, load_b, store, n.op,
                 k_contiguous=(True, True), conv=True)  # K walks pixels in both operands


def _map_kernel(bind, total, body, label):
    wgsl = per_output(bind.decls(), total, body)
    return KernelCode(wgsl, (WG, 1, 1), bind.list(), grid(-(-total // WG)), label)


def pool(sched: Schedule, k: Kernel) -> KernelCode:
    g = sched.graph
    r = k.roots[0]
    n = g.nodes[r]
    at = dict(n.attrs)
    kh, kw, s, p, d, _ = pool_attrs(at)
    bind = Bindings(sched)
    x = g.nodes[n.inputs[0]]
    nb, c, h, w = x.shape
    tx = None if n.op == "max_pool2d_grad" else bind.use(base_of(g, n.inputs[0]))
    if n.op in ("max_pool2d", "avg_pool2d"):
        ho, wo = n.shape[2], n.shape[3]
        out = bind.use(r, write=True)
        lines = [_split("idx", ["plane", "oy", "ox"], [nb * c, ho, wo]),
                 f"    let y0 = i32(oy * {s[0]}u) - {p[0]};", f"    let x0 = i32(ox * {s[1]}u) - {p[1]};"]
        if n.op == "max_pool2d":
            lines += ["    var m = bitcast<f32>(0xff800000u);",
                      f"    for (var ky = 0; ky < {kh}; ky++) {{ for (var kx = 0; kx < {kw}; kx++) {{",
                      f"        let iy = y0 + ky * {d[0]}; let ix = x0 + kx * {d[1]};",
                      f"        if (iy >= 0 && iy < {h} && ix >= 0 && ix < {w}) {{",
                      f"            let v = {tx}[(plane * {h}u + u32(iy)) * {w}u + u32(ix)];",
                      "            if (v > m || v != v) { m = v; }",
                      "        }", "    } }", f"    {out}[idx] = m;"]
        else:
            lines += ["    var acc = 0.0;",
                      f"    for (var ky = 0; ky < {kh}; ky++) {{ for (var kx = 0; kx < {kw}; kx++) {{",
                      "        let iy = y0 + ky; let ix = x0 + kx;",
                      f"        if (iy >= 0 && iy < {h} && ix >= 0 && ix < {w}) {{",
                      f"            acc += {tx}[(plane * {h}u + u32(iy)) * {w}u + u32(ix)];",
                      "        }", "    } }", _divisor(at, h, w, kh, kw, p), f"    {out}[idx] = acc / div;"]
        return _map_kernel(bind, n.size, "\n".join(lines), n.op)
    # gradients: one thread per input pixel gathers from the windows that cover it
    gy = g.nodes[n.inputs[1]]
    ho, wo = gy.shape[2], gy.shape[3]
    first = None
    if n.op == "max_pool2d_grad":
        # first pass: each window's first maximum (its input pixel within the plane, -1: none),
        # found once, not per covering pixel (bench/REJECTED.md: max-pool gradient)
        arg = sched.new_temp()
        pre = Bindings(sched)
        tx0 = pre.use(base_of(g, n.inputs[0]))
        targ = pre.use_key(arg, write=True, dtype="i32")
        body = [_split("idx", ["plane", "oy", "ox"], [nb * c, ho, wo]),
                f"    let y0 = i32(oy * {s[0]}u) - {p[0]}; let x0 = i32(ox * {s[1]}u) - {p[1]};",
                "    var m = bitcast<f32>(0xff800000u); var best = -1;",
                f"    for (var qy = 0; qy < {kh}; qy++) {{ for (var qx = 0; qx < {kw}; qx++) {{",
                f"        let yy = y0 + qy * {d[0]}; let xx = x0 + qx * {d[1]};",
                f"        if (yy >= 0 && yy < {h} && xx >= 0 && xx < {w}) {{",
                f"            let v = {tx0}[(plane * {h}u + u32(yy)) * {w}u + u32(xx)];",
                f"            if (v > m || (v != v && m == m)) {{ m = v; best = yy * {w} + xx; }}",
                "        }", "    } }", f"    {targ}[idx] = best;"]
        first = _map_kernel(pre, gy.size, "\n".join(body), n.op + "/argmax")
        first.temps = {arg: gy.size * 4}
        tx = bind.use_key(arg, dtype="i32")
    tg = bind.use(base_of(g, n.inputs[1]))
    out = bind.use(r, write=True)
    lines = [_split("idx", ["plane", "iy", "ix"], [nb * c, h, w]), "    var acc = 0.0;",
             f"    for (var ky = 0; ky < {kh}; ky++) {{ for (var kx = 0; kx < {kw}; kx++) {{",
             f"        let ty = i32(iy) + {p[0]} - ky * {d[0] if n.op == 'max_pool2d_grad' else 1};",
             f"        let tx = i32(ix) + {p[1]} - kx * {d[1] if n.op == 'max_pool2d_grad' else 1};",
             f"        if (ty < 0 || tx < 0 || ty % {s[0]} != 0 || tx % {s[1]} != 0) {{ continue; }}",
             f"        let oy = u32(ty / {s[0]}); let ox = u32(tx / {s[1]});",
             f"        if (oy >= {ho}u || ox >= {wo}u) {{ continue; }}",
             f"        let gv = {tg}[(plane * {ho}u + oy) * {wo}u + ox];"]
    if n.op == "max_pool2d_grad":
        lines += [f"        if ({tx}[(plane * {ho}u + oy) * {wo}u + ox] == i32(iy * {w}u + ix)) {{ acc += gv; }}"]
    else:
        lines += ["        let oy_ = oy; let ox_ = ox;", _divisor(at, h, w, kh, kw, p, "oy_", "ox_", "        "),
                  "        acc += gv / div;"]
    lines += ["    } }", f"    {out}[idx] = acc;"]
    if first is not None:
        return [first, _map_kernel(bind, n.size, "\n".join(lines), n.op)]
    return _map_kernel(bind, n.size, "\n".join(lines), n.op)


def _divisor(at, h, w, kh, kw, p, oy="oy", ox="ox", ind="    "):
    """PyTorch's avg-pool divisor for window (oy, ox)."""
    _, _, s, _, _, _ = pool_attrs(at)
    include = bool(at.get("count_include_pad", True))
    lines = [f"let wy0 = i32({oy} * {s[0]}u) - {p[0]}; let wx0 = i32({ox} * {s[1]}u) - {p[1]};",
             f"let wy1 = min(wy0 + {kh}, {h + p[2]}); let wx1 = min(wx0 + {kw}, {w + p[3]});"]
    if include:
        lines.append("let div = f32((wy1 - wy0) * (wx1 - wx0));")
    else:
        lines.append(f"let div = f32((min(wy1, {h}) - max(wy0, 0)) * (min(wx1, {w}) - max(wx0, 0)));")
    return "\n".join(ind + ln for ln in lines)


def gather(sched: Schedule, k: Kernel) -> KernelCode:
    g = sched.graph
    r = k.roots[0]
    n = g.nodes[r]
    bind = Bindings(sched)
    if n.op == "gather":
        table, idx = (g.nodes[i] for i in n.inputs)
        rows = table.shape[0]
        inner = table.size // max(rows, 1)
        tt = bind.use(base_of(g, n.inputs[0]))
        ti = bind.use(base_of(g, n.inputs[1]))
        out = bind.use(r, write=True)
        zero = "0" if n.dtype == "i32" else "0.0"
        body = "\n".join([f"    let i = idx / {inner}u;", f"    let j = idx % {inner}u;",
                          f"    var row = {ti}[i];", f"    if (row < 0) {{ row += {rows}; }}",
                          f"    if (row < 0 || row >= {rows}) {{ {out}[idx] = {zero}; return; }}",
                          f"    {out}[idx] = {tt}[u32(row) * {inner}u + j];"])
        return _map_kernel(bind, n.size, body, "gather")
    # scatter_add, deterministic and without atomics: the table zeroed; a thread per index links
    # it to the next index of the same row and marks the first of each row; a thread per (first
    # index, column) sums its row's values along the links, in index order. (A thread per column
    # walks the whole table; scanning every index per (index, column) grows with count^2 x
    # columns: bench/REJECTED.md.)
    idx = g.nodes[n.inputs[1]]
    rows = n.shape[0]
    inner = n.size // max(rows, 1)
    count = idx.size
    zero_bind = Bindings(sched)
    zero = _map_kernel(zero_bind, n.size, f"    {zero_bind.use(r, write=True)}[idx] = 0.0;", "scatter_add/zero")
    temp = sched.new_temp()  # next index of the same row (-1: none) per index, then 1 per first index

    def row_of(ti):
        return f"fn row_of(i: u32) -> i32 {{ let v = {ti}[i]; return select(v, v + {rows}, v < 0); }}"
    link_bind = Bindings(sched)
    ti = link_bind.use(base_of(g, n.inputs[1]))
    decls = link_bind.decls() + f"\n@group(0) @binding({len(link_bind.slots)}) var<storage, read_write> link: array<i32>;"
    body = "\n".join([
        "    let row = row_of(idx);", "    var first = 1;", "    var nxt = -1;",
        f"    if (row < 0 || row >= {rows}) {{ first = 0; }}",
        "    for (var j = 0u; j < idx && first == 1; j++) { if (row_of(j) == row) { first = 0; } }",
        f"    for (var j = idx + 1u; j < {count}u && first >= 0 && row >= 0 && row < {rows}; j++) {{",
        "        if (row_of(j) == row) { nxt = i32(j); break; }", "    }",
        "    link[idx] = nxt;", f"    link[{count}u + idx] = first;"])
    link = KernelCode(per_output(decls + "\n" + row_of(ti), count, body), (WG, 1, 1),
                      link_bind.list() + [(temp, "read_write")], grid(-(-count // WG)), "scatter_add/link")
    link.temps = {temp: 8 * max(count, 1)}
    tg = bind.use(base_of(g, n.inputs[0]))
    ti = bind.use(base_of(g, n.inputs[1]))
    out = bind.use(r, write=True)
    decls = bind.decls() + f"\n@group(0) @binding({len(bind.slots)}) var<storage, read> link: array<i32>;"
    if n.op == "scatter_add":
        walk = ["    var acc = 0.0;", "    var j = i32(i);",
                f"    loop {{ acc += {tg}[u32(j) * {inner}u + c]; j = link[u32(j)]; if (j < 0) {{ break; }} }}"]
    else:  # scatter_reduce: the row's first update, combined with the next ones in index order
        combine = {"none": "v", "mul": "acc * v", "max": "max(acc, v)", "min": "min(acc, v)"}[n.attr("reduction")]
        walk = [f"    var acc = {tg}[i * {inner}u + c];", "    var j = link[i];",
                (f"    loop {{ if (j < 0) {{ break; }} let v = {tg}[u32(j) * {inner}u + c]; acc = {combine}; "
                 "j = link[u32(j)]; }")]
    body = "\n".join([
        f"    let i = idx / {inner}u;", f"    let c = idx % {inner}u;",
        f"    if (link[{count}u + i] == 0) {{ return; }}  // not the first index of its row", *walk,
        f"    {out}[u32(row_of(i)) * {inner}u + c] = acc;"])
    fill = KernelCode(per_output(decls + "\n" + row_of(ti), count * inner, body), (WG, 1, 1),
                      bind.list() + [(temp, "read")], grid(-(-count * inner // WG)), n.op)
    return [zero, link, fill]

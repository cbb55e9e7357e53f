"""WGSL for convolutions (implicit GEMM), pooling and gathers.

Convolutions never build an im2col matrix: the implicit-GEMM template's load functions
compute, for each (row, column) of the virtual matrix, which input element it is.
  forward          C[co, (n,oy,ox)]  = W[co, (ci,ky,kx)] . X[(ci,ky,kx), (n,oy,ox)]
  input gradient   (= conv_transpose2d) gathers, for each input pixel, the outputs it fed
  weight gradient  C[co, (ci,ky,kx)] = dY[co, (n,oy,ox)] . X[(n,oy,ox), (ci,ky,kx)]
Groups are the GEMM's batch dimension.
"""
from __future__ import annotations

from .codegen import WG, KernelCode, _Bindings, _strides, _temp_ids, grid, igemm, per_output
from .ops_nn import _conv_attrs, _pool_attrs
from .schedule import Kernel, Schedule, base_of
from .wgsl import render


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
    s, p, d, groups = _conv_attrs(dict(n.attrs))
    bind = _Bindings(g, sched.storage)
    bind.use(base_of(g, n.inputs[0]), own=True)
    bind.use(base_of(g, n.inputs[1]), own=True)
    bind.use(r, write=True, own=True)
    if n.op == "conv2d":
        x, w = a.shape, b.shape  # x [N, C, H, W], w [O, C/g, kh, kw]
        nb, c, h, wd = x
        o, cg, kh, kw = w
        ho, wo = n.shape[2], n.shape[3]
        og = o // groups
        kk = cg * kh * kw
        load_a = f"    return b[(g * {og}u + m) * {kk}u + k];"  # the weight is operand 1 (binding b)
        load_b = "\n".join([
            _split("k", ["ci", "ky", "kx"], [cg, kh, kw]), _split("n", ["nb", "oy", "ox"], [nb, ho, wo]),
            f"    let iy = i32(oy * {s[0]}u + ky * {d[0]}u) - {p[0]};",
            f"    let ix = i32(ox * {s[1]}u + kx * {d[1]}u) - {p[1]};",
            f"    if (iy < 0 || iy >= {h} || ix < 0 || ix >= {wd}) {{ return 0.0; }}",
            f"    return a[((nb * {c}u + g * {cg}u + ci) * {h}u + u32(iy)) * {wd}u + u32(ix)];"])
        store = "\n".join([_split("n", ["nb", "pix"], [nb, ho * wo]),
                           f"    c[(nb * {o}u + g * {og}u + m) * {ho * wo}u + pix] = v;"])
        return igemm(bind, og, nb * ho * wo, kk, groups, load_a, load_b, store, "conv2d")
    if n.op == "conv_transpose2d":
        x, w = a.shape, b.shape  # x [N, Cin, H, W], w [Cin, Cout/g, kh, kw]
        nb, cin, h, wd = x
        _, og, kh, kw = w
        cg = cin // groups
        ho, wo = n.shape[2], n.shape[3]
        cout = og * groups
        kk = cg * kh * kw
        load_a = "\n".join([_split("k", ["ci", "r"], [cg, kh * kw]),
                            f"    return b[((g * {cg}u + ci) * {og}u + m) * {kh * kw}u + r];"])
        load_b = "\n".join([
            _split("k", ["ci", "ky", "kx"], [cg, kh, kw]), _split("n", ["nb", "oy", "ox"], [nb, ho, wo]),
            f"    let ty = i32(oy) + {p[0]} - i32(ky * {d[0]}u);",
            f"    let tx = i32(ox) + {p[1]} - i32(kx * {d[1]}u);",
            f"    if (ty < 0 || tx < 0 || ty % {s[0]} != 0 || tx % {s[1]} != 0) {{ return 0.0; }}",
            f"    let iy = ty / {s[0]};",
            f"    let ix = tx / {s[1]};",
            f"    if (iy >= {h} || ix >= {wd}) {{ return 0.0; }}",
            f"    return a[((nb * {cin}u + g * {cg}u + ci) * {h}u + u32(iy)) * {wd}u + u32(ix)];"])
        store = "\n".join([_split("n", ["nb", "pix"], [nb, ho * wo]),
                           f"    c[(nb * {cout}u + g * {og}u + m) * {ho * wo}u + pix] = v;"])
        return igemm(bind, og, nb * ho * wo, kk, groups, load_a, load_b, store, "conv_transpose2d")
    # conv2d_weight_grad(x, gy) -> [O, C/g, kh, kw]
    x, gy = a.shape, b.shape
    nb, c, h, wd = x
    _, o, ho, wo = gy
    kh, kw = n.attr("kernel")
    cg, og = c // groups, o // groups
    load_a = "\n".join([_split("k", ["nb", "pix"], [nb, ho * wo]),
                        f"    return b[(nb * {o}u + g * {og}u + m) * {ho * wo}u + pix];"])
    load_b = "\n".join([
        _split("k", ["nb", "oy", "ox"], [nb, ho, wo]), _split("n", ["ci", "ky", "kx"], [cg, kh, kw]),
        f"    let iy = i32(oy * {s[0]}u + ky * {d[0]}u) - {p[0]};",
        f"    let ix = i32(ox * {s[1]}u + kx * {d[1]}u) - {p[1]};",
        f"    if (iy < 0 || iy >= {h} || ix < 0 || ix >= {wd}) {{ return 0.0; }}",
        f"    return a[((nb * {c}u + g * {cg}u + ci) * {h}u + u32(iy)) * {wd}u + u32(ix)];"])
    store = f"    c[(g * {og}u + m) * {cg * kh * kw}u + n] = v;"
    return igemm(bind, og, cg * kh * kw, nb * ho * wo, groups, load_a, load_b, store, "conv2d_weight_grad")


def _map_kernel(bind, total, body, label):
    wgsl = per_output(bind.decls(), total, body)
    return KernelCode(wgsl, (WG, 1, 1), bind.list(), grid(-(-total // WG)), label)


def pool(sched: Schedule, k: Kernel) -> KernelCode:
    g = sched.graph
    r = k.roots[0]
    n = g.nodes[r]
    at = dict(n.attrs)
    kh, kw, s, p, d, _ = _pool_attrs(at)
    bind = _Bindings(g, sched.storage)
    x = g.nodes[n.inputs[0]]
    nb, c, h, w = x.shape
    tx = bind.use(base_of(g, n.inputs[0]))
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
        # recompute the window's first maximum; the gradient goes there only
        lines += [f"        let y0 = i32(oy * {s[0]}u) - {p[0]}; let x0 = i32(ox * {s[1]}u) - {p[1]};",
                  "        var m = bitcast<f32>(0xff800000u); var best = -1;",
                  f"        for (var qy = 0; qy < {kh}; qy++) {{ for (var qx = 0; qx < {kw}; qx++) {{",
                  f"            let yy = y0 + qy * {d[0]}; let xx = x0 + qx * {d[1]};",
                  f"            if (yy >= 0 && yy < {h} && xx >= 0 && xx < {w}) {{",
                  f"                let v = {tx}[(plane * {h}u + u32(yy)) * {w}u + u32(xx)];",
                  f"                if (v > m || (v != v && m == m)) {{ m = v; best = qy * {kw} + qx; }}",
                  "            }", "        } }",
                  f"        if (best == ky * {kw} + kx) {{ acc += gv; }}"]
    else:
        lines += ["        let oy_ = oy; let ox_ = ox;", _divisor(at, h, w, kh, kw, p, "oy_", "ox_", "        "),
                  "        acc += gv / div;"]
    lines += ["    } }", f"    {out}[idx] = acc;"]
    return _map_kernel(bind, n.size, "\n".join(lines), n.op)


def _divisor(at, h, w, kh, kw, p, oy="oy", ox="ox", ind="    "):
    """PyTorch's avg-pool divisor for window (oy, ox)."""
    _, _, s, _, _, _ = _pool_attrs(at)
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
    bind = _Bindings(g, sched.storage)
    if n.op == "gather":
        table, idx = (g.nodes[i] for i in n.inputs)
        rows = table.shape[0]
        inner = table.size // max(rows, 1)
        tt = bind.use(base_of(g, n.inputs[0]))
        ti = bind.use(base_of(g, n.inputs[1]))
        out = bind.use(r, write=True)
        body = "\n".join([f"    let i = idx / {inner}u;", f"    let j = idx % {inner}u;",
                          f"    var row = {ti}[i];", f"    if (row < 0) {{ row += {rows}; }}",
                          f"    if (row < 0 || row >= {rows}) {{ {out}[idx] = 0.0; return; }}",
                          f"    {out}[idx] = {tt}[u32(row) * {inner}u + j];"])
        return _map_kernel(bind, n.size, body, "gather")
    # scatter_add: each thread owns one column, so duplicate indices need no atomics
    gy, idx = (g.nodes[i] for i in n.inputs)
    rows = n.shape[0]
    inner = n.size // max(rows, 1)
    count = idx.size
    tg = bind.use(base_of(g, n.inputs[0]))
    ti = bind.use(base_of(g, n.inputs[1]))
    out = bind.use(r, write=True)
    body = "\n".join([f"    for (var r = 0u; r < {rows}u; r++) {{ {out}[r * {inner}u + idx] = 0.0; }}",
                      f"    for (var i = 0u; i < {count}u; i++) {{",
                      f"        var row = {ti}[i];", f"        if (row < 0) {{ row += {rows}; }}",
                      f"        if (row < 0 || row >= {rows}) {{ continue; }}",
                      f"        {out}[u32(row) * {inner}u + idx] += {tg}[i * {inner}u + idx];", "    }"])
    return _map_kernel(bind, inner, body, "scatter_add")


def attention(sched: Schedule, k: Kernel) -> KernelCode:
    """Fused attention (see kernels/attention.wgsl); a CPU-rasteriser variant reads keys and
    values straight from memory instead of staging them behind barriers."""
    import math

    from .codegen import f32_literal

    g = sched.graph
    r = k.roots[0]
    n = g.nodes[r]
    q, kk, v = (g.nodes[i] for i in n.inputs)
    b, h, s, d = q.shape
    hk, t = kk.shape[1], kk.shape[2]
    dv4 = d // 4
    scale = n.attr("scale")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    bind = _Bindings(g, sched.storage)
    strides = []
    for i in n.inputs:
        if i in sched.views:  # read through the transpose in front: [b, t, h, d] strides, permuted
            st = _strides(g.nodes[g.nodes[i].inputs[0]].shape)
            strides.append((st[0], st[2], st[1]))
            bind.use(sched.views[i], own=True)
        else:
            st = _strides(g.nodes[i].shape)
            strides.append((st[0], st[1], st[2]))
            bind.use(base_of(g, i), own=True)
    bind.use(r, write=True, own=True)
    (qsb, qsh, qst), (ksb, ksh, kst), (vsb, vsh, vst) = strides
    # few query blocks (one row per thread) cannot fill a GPU: split the keys across
    # workgroups and merge the partial softmaxes after (flash-decoding)
    blocks = -(-s // 64) * b * h
    split = 1 if blocks >= 256 or t < 256 else max(1, min(16, -(-256 // blocks), t // 128))
    kl = -(-(-(-t // split)) // 32) * 32
    split = -(-t // kl)
    width = 4 * dv4 + 2
    if split == 1:
        decls = bind.decls(["q", "k", "v", "out"])
        store = "        let inv = 1.0 / l;\n        let o = ((bh * S) + row) * DV4 * 4u;\n" + "\n".join(
            f"        out[o + {4 * c}u] = acc{c}.x * inv; out[o + {4 * c + 1}u] = acc{c}.y * inv; "
            f"out[o + {4 * c + 2}u] = acc{c}.z * inv; out[o + {4 * c + 3}u] = acc{c}.w * inv;" for c in range(dv4))
        slots = bind.list()
    else:
        temp = ("temp", next(_temp_ids))
        decls = "\n".join(bind.decls(["q", "k", "v", "out"]).splitlines()[:3]) + \
            "\n@group(0) @binding(3) var<storage, read_write> part: array<f32>;"
        store = (f"        let o = ((split * {b * h}u + bh) * S + row) * {width}u;\n        part[o] = m;\n"
                 "        part[o + 1u] = l;\n" + "\n".join(
                     f"        part[o + {2 + 4 * c}u] = acc{c}.x; part[o + {3 + 4 * c}u] = acc{c}.y; "
                     f"part[o + {4 + 4 * c}u] = acc{c}.z; part[o + {5 + 4 * c}u] = acc{c}.w;" for c in range(dv4)))
        slots = bind.list()[:3] + [(temp, "read_write")]
    q_load = "\n".join(f"    let q{c} = vec4<f32>(q[q_base + {4 * c}u], q[q_base + {4 * c + 1}u], "
                       f"q[q_base + {4 * c + 2}u], q[q_base + {4 * c + 3}u]);" for c in range(dv4))
    acc = "\n".join(f"    var acc{c} = vec4<f32>(0.0);" for c in range(dv4))
    common = dict(BINDINGS=decls, S=s, T=t, H=h, HK=hk, REP=h // hk, DV4=dv4, SCALE=f32_literal(scale), SPLIT=split, KL=kl,
                  QSB=qsb, QSH=qsh, QST=qst, KSB=ksb, KSH=ksh, KST=kst, VSB=vsb, VSH=vsh, VST=vst,
                  CAUSAL="true" if n.attr("causal") else "false", Q_LOAD=q_load, ACC_DECL=acc, STORE=store)

    def body(shared: bool):
        key = (lambda c: f"k_tile[jj * {dv4}u + {c}u]") if shared else (lambda c: f"k4(k_base, j, {c}u)")
        val = (lambda c: f"v_tile[jj * {dv4}u + {c}u]") if shared else (lambda c: f"v4(v_base, j, {c}u)")
        score = "            let s = (" + " + ".join(f"dot(q{c}, {key(c)})" for c in range(dv4)) + ") * SCALE;"
        update = "\n".join(f"                acc{c} = acc{c} * corr + p * {val(c)};" for c in range(dv4))
        stage = ""
        if shared:
            stage = "\n".join([
                f"        for (var i = lid; i < TILE * {dv4}u; i = i + 64u) {{",
                f"            let jj = i / {dv4}u;", f"            let c = i % {dv4}u;",
                "            let jk = min(j0 + jj, T - 1u);",
                "            k_tile[i] = k4(k_base, jk, c);", "            v_tile[i] = v4(v_base, jk, c);",
                "        }", "        workgroupBarrier();"])
        return dict(SCORE=score, ACC_UPDATE=update, STAGE=stage,
                    STAGE_END="        workgroupBarrier();" if shared else "",
                    SHARED="shared" if shared else "not shared", TILE_VEC4=32 * dv4 if shared else 1)

    wgsl = render("attention", **common, **body(True))
    groups = (-(-s // 64), b * h, split)
    code = KernelCode(wgsl, (64, 1, 1), slots, groups, "attention")
    code.variants = {"cpu": (render("attention", **common, **body(False)), (64, 1, 1), groups)}
    if split == 1:
        return code
    code.temps = {temp: split * b * h * s * width * 4}
    rows = b * h * s
    merge = "\n".join([  # a thread per output value: the merge must not starve the GPU either
        f"    let c = idx % {d}u;", f"    let bh = (idx / {d}u) / {s}u;", f"    let row = (idx / {d}u) % {s}u;",
        "    var mx = -3.4028235e38;",
        f"    for (var p = 0u; p < {split}u; p++) {{ mx = max(mx, part[((p * {b * h}u + bh) * {s}u + row) * {width}u]); }}",
        "    var l = 0.0;",
        "    var acc = 0.0;",
        f"    for (var p = 0u; p < {split}u; p++) {{",
        f"        let o = ((p * {b * h}u + bh) * {s}u + row) * {width}u;",
        "        let w = exp(part[o] - mx);",
        "        l += part[o + 1u] * w;",
        "        acc += part[o + 2u + c] * w;", "    }",
        "    out[idx] = acc / l;"])
    mdecls = ("@group(0) @binding(0) var<storage, read> part: array<f32>;\n"
              "@group(0) @binding(1) var<storage, read_write> out: array<f32>;")
    merged = KernelCode(per_output(mdecls, rows * d, merge), (WG, 1, 1),
                        [(temp, "read"), bind.list()[3]], grid(-(-rows * d // WG)), "attention/merge")
    return [code, merged]

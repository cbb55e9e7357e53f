"""What a storage read costs a CPU rasteriser's workgroup of 8 lanes: 16 vec4 reads of one
address for all lanes, of a different address per lane, or two reads per lane shared
through subgroupBroadcast (what the CPU kernel variants do, compiler/codegen/common.py
shared_loads).

    python bench/lane_reads.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KEYS, GROUPS = 4096, 64
HEAD = """@group(0) @binding(0) var<storage, read> kv: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> o: array<vec4<f32>>;

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    var acc = vec4<f32>(0.0);
    let q = vec4<f32>(f32(lane));
    for (var j = 0u; j < KEYS; j = j + 1u) {
"""
TAIL = """    }
    o[wg.x * 8u + lane] = acc;
}"""


def kernels() -> dict:
    same = "\n".join(f"        acc = acc + q * kv[j * 16u + {c}u];" for c in range(16))
    apart = "\n".join(f"        acc = acc + q * kv[(j * 16u + {c}u + lane * 3u) % 65536u];" for c in range(16))
    shared = "\n".join(["        let a = kv[j * 16u + lane];", "        let b = kv[j * 16u + 8u + lane];"] + [
        f"        acc = acc + q * subgroupBroadcast({'a' if c < 8 else 'b'}, {c % 8}u);" for c in range(16)])
    const = f"const KEYS: u32 = {KEYS}u;\n"
    return {name: const + HEAD + body + "\n" + TAIL for name, body in
            (("one address, every lane reads", same), ("an address per lane", apart),
             ("one address, read by one lane and broadcast", shared))}


def main() -> None:
    import wgpu
    from meganeura.runtime.device import default_device

    dev = default_device()
    print(f"{dev.adapter.info['device']} ({dev.adapter.info['description']})")
    data = dev.create_buffer_with_data(data=np.random.default_rng(0).random(KEYS * 64, np.float32),
                                       usage=wgpu.BufferUsage.STORAGE)
    out = dev.create_buffer(size=GROUPS * 8 * 16, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    for name, src in kernels().items():
        if "subgroupBroadcast" in src and "subgroup" not in dev.features:
            print(f"{name}: no subgroup feature")
            continue
        p = dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=src),
                                                                "entry_point": "main"})
        bg = dev.create_bind_group(layout=p.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": data}}, {"binding": 1, "resource": {"buffer": out}}])
        times = []
        for _ in range(4):
            enc = dev.create_command_encoder()
            cp = enc.begin_compute_pass()
            cp.set_pipeline(p)
            cp.set_bind_group(0, bg)
            cp.dispatch_workgroups(GROUPS)
            cp.end()
            t = time.perf_counter()
            dev.queue.submit([enc.finish()])
            dev.queue.read_buffer(out, size=16)
            times.append(time.perf_counter() - t)
        best = min(times[1:])
        print(f"{name}: {best * 1e3:.1f} ms, {best / (GROUPS * KEYS) * 1e9:.0f} ns per workgroup per 16 vec4s")


if __name__ == "__main__":
    main()

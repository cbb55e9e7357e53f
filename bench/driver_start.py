"""The driver's start-up in a process, which any host pays before it loads a package (a game
has drawn frames by then: made pipelines, layouts, bind groups and buffers): the first compute
pipeline the driver compiles (it loads the shader compiler), a second one, then one with layouts
made apart, and a first buffer written, run on and read back."""
from __future__ import annotations

import time

import numpy as np

_KERNEL = """@group(0) @binding(0) var<storage, read_write> x: array<f32>;
var<workgroup> t: array<f32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    t[lid.x] = x[gid.x];
    workgroupBarrier();
    var s = 0.0;
    for (var i = 0u; i < 64u; i = i + 1u) {
        s = s + t[i] * {scale};
    }
    x[gid.x] = s;
}
"""


def warm(device) -> dict:
    """Three pipelines (texts new to the driver's cache) and a 64 MiB buffer written, run on and
    read back; each one's seconds."""
    import wgpu

    times, pipeline = {}, None
    for which, scale in (("first_pipeline_s", time.time() % 1 + 2.0), ("second_pipeline_s", time.time() % 1 + 3.0)):
        t = time.perf_counter()
        module = device.create_shader_module(code=_KERNEL.replace("{scale}", repr(float(scale))))
        pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        times[which] = time.perf_counter() - t
    t = time.perf_counter()
    bgl = device.create_bind_group_layout(entries=[{"binding": 0, "visibility": wgpu.ShaderStage.COMPUTE,
                                                    "buffer": {"type": "storage"}}])
    module = device.create_shader_module(code=_KERNEL.replace("{scale}", repr(float(time.time() % 1 + 4.0))))
    pipeline = device.create_compute_pipeline(layout=device.create_pipeline_layout(bind_group_layouts=[bgl]),
                                              compute={"module": module, "entry_point": "main"})
    times["layouts_and_pipeline_s"] = time.perf_counter() - t
    t = time.perf_counter()
    data = np.ones(16 << 20, np.float32)
    buf = device.create_buffer(size=data.nbytes, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST
                               | wgpu.BufferUsage.COPY_SRC)
    device.queue.write_buffer(buf, 0, data)
    enc = device.create_command_encoder()
    cpass = enc.begin_compute_pass()
    cpass.set_pipeline(pipeline)
    cpass.set_bind_group(0, device.create_bind_group(layout=bgl, entries=[{"binding": 0, "resource": {"buffer": buf}}]))
    cpass.dispatch_workgroups(256)
    cpass.end()
    device.queue.submit([enc.finish()])
    device.queue.read_buffer(buf, 0, 256)
    times["first_buffer_s"] = time.perf_counter() - t
    buf.destroy()
    return times

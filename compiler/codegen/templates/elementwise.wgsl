// One thread per output element, with a body the compiler writes: a fused chain of
// elementwise ops (inputs read through strides, so broadcasting and transposes need no
// copies), or a pooling window, a gather, the sum of split-K partials.
{{PRELUDE}}
{{BINDINGS}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 256u;
    if (idx >= {{TOTAL}}u) {
        return;
    }
{{COORDS}}
{{BODY}}
}

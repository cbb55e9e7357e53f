// One thread per output element, with a body the compiler writes per op: pooling
// windows, their gradients, gathers. Like elementwise.wgsl, but not fusable.
{{BINDINGS}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 256u;
    if (idx >= {{TOTAL}}u) {
        return;
    }
{{BODY}}
}

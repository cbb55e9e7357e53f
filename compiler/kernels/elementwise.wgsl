// A fused chain of elementwise ops: one thread per output element.
// Inputs are read through strides, so broadcasting and transposes need no copies.
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

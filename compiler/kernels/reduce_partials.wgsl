// Second pass of a split reduction: output idx of reduction z is the S slices' partials
// combined in slice order (deterministic), stored through the kernel's store().
{{BINDINGS}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 256u;
    if (idx >= {{OUTPUTS}}u) {
        return;
    }
    var acc = {{INIT}};
    for (var s = 0u; s < {{S}}u; s = s + 1u) {
        acc = {{COMBINE}}(acc, partial[(gid.z * {{S}}u + s) * {{OUTPUTS}}u + idx]);
    }
    store(gid.z, idx, acc);
}

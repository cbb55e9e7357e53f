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
    let base = gid.z * {{S}}u * {{OUTPUTS}}u + idx;
    var s = 0u;
    // four loads in flight, combined in slice order (see reduce_cols.wgsl)
    for (; s + 4u <= {{S}}u; s = s + 4u) {
        let at = base + s * {{OUTPUTS}}u;
        let v0 = partial[at];
        let v1 = partial[at + {{OUTPUTS}}u];
        let v2 = partial[at + 2u * {{OUTPUTS}}u];
        let v3 = partial[at + 3u * {{OUTPUTS}}u];
        acc = {{COMBINE}}({{COMBINE}}({{COMBINE}}({{COMBINE}}(acc, v0), v1), v2), v3);
    }
    for (; s < {{S}}u; s = s + 1u) {
        acc = {{COMBINE}}(acc, partial[base + s * {{OUTPUTS}}u]);
    }
    store(gid.z, idx, acc);
}

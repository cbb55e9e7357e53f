// Reduces the middle axis of [OUTER, R, INNER] with INNER > 1: one thread per output,
// neighbouring threads read neighbouring columns. Workgroup layer z: which reduction.
{{BINDINGS}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 256u;
    if (idx >= {{OUTER}}u * {{INNER}}u) {
        return;
    }
    let o = idx / {{INNER}}u;
    let i = idx % {{INNER}}u;
    var acc = {{INIT}};
    for (var r = 0u; r < {{R}}u; r = r + 1u) {
        acc = {{COMBINE}}(acc, load(gid.z, (o * {{R}}u + r) * {{INNER}}u + i));
    }
    store(gid.z, idx, acc);
}

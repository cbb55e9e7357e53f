// First pass of a split column reduction: [OUTER, R, INNER] with few outputs and a long R.
// One thread per (slice, output): it reduces rows [s * RS, min(R, (s + 1) * RS)) of its
// column into partial[(z * S + s) * OUTER * INNER + idx]; reduce_partials.wgsl sums the S
// slices. Barrier-free (CPU rasterisers emulate barriers slowly); layer z: which reduction.
{{BINDINGS}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    if (t >= {{S}}u * {{OUTER}}u * {{INNER}}u) {
        return;
    }
    let s = t / ({{OUTER}}u * {{INNER}}u);
    let idx = t % ({{OUTER}}u * {{INNER}}u);
    let o = idx / {{INNER}}u;
    let i = idx % {{INNER}}u;
    var acc = {{INIT}};
    let end = min({{R}}u, (s + 1u) * {{RS}}u);
    for (var r = s * {{RS}}u; r < end; r = r + 1u) {
        acc = {{COMBINE}}(acc, load(gid.z, (o * {{R}}u + r) * {{INNER}}u + i));
    }
    partial[(gid.z * {{S}}u + s) * {{OUTER}}u * {{INNER}}u + idx] = acc;
}

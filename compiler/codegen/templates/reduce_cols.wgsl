// Reduces the middle axis of [OUTER, R, INNER] with INNER > 1 (or short rows): one thread per
// (slice of RS rows, output), neighbouring threads reading neighbouring columns;
// emit(z, slice, idx, v) stores the output (S = 1) or the slice's partial for
// reduce_partials.wgsl. Barrier-free (CPU rasterisers emulate barriers slowly).
// Workgroup layer z: which reduction.
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
    var r = s * {{RS}}u;
    // four rows' loads in flight, combined in row order (the same sums as one row at a time): wgpu's
    // loop bounding keeps the driver from unrolling a checked loop itself
    for (; r + 4u <= end; r = r + 4u) {
        let at = (o * {{R}}u + r) * {{INNER}}u + i;
        let v0 = load(gid.z, at);
        let v1 = load(gid.z, at + {{INNER}}u);
        let v2 = load(gid.z, at + 2u * {{INNER}}u);
        let v3 = load(gid.z, at + 3u * {{INNER}}u);
        acc = {{COMBINE}}({{COMBINE}}({{COMBINE}}({{COMBINE}}(acc, v0), v1), v2), v3);
    }
    for (; r < end; r = r + 1u) {
        acc = {{COMBINE}}(acc, load(gid.z, (o * {{R}}u + r) * {{INNER}}u + i));
    }
    emit(gid.z, s, idx, acc);
}

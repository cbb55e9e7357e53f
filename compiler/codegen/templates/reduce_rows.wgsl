// Reduces the middle axis of [OUTER, R, 1]: one workgroup per (row, slice of RS elements),
// 64 threads striding over it, then a tree in workgroup memory; emit(z, slice, row, v)
// stores the row's value (S = 1) or the slice's partial for reduce_partials.wgsl.
// Workgroup layer z: which reduction.
{{BINDINGS}}

var<workgroup> part: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let job = wg.x + wg.y * nwg.x;
    if (job >= {{OUTER}}u * {{S}}u) {
        return;  // uniform across the workgroup
    }
    let row = job % {{OUTER}}u;
    let s = job / {{OUTER}}u;
    let end = min({{R}}u, (s + 1u) * {{RS}}u);
    var acc = {{INIT}};
    var r = s * {{RS}}u + lid;
    // four loads in flight, combined in order (the same sums as one at a time): wgpu's loop
    // bounding keeps the driver from unrolling a checked loop itself
    for (; r + 192u < end; r = r + 256u) {
        let at = row * {{R}}u + r;
        let v0 = load(wg.z, at);
        let v1 = load(wg.z, at + 64u);
        let v2 = load(wg.z, at + 128u);
        let v3 = load(wg.z, at + 192u);
        acc = {{COMBINE}}({{COMBINE}}({{COMBINE}}({{COMBINE}}(acc, v0), v1), v2), v3);
    }
    for (; r < end; r = r + 64u) {
        acc = {{COMBINE}}(acc, load(wg.z, row * {{R}}u + r));
    }
    part[lid] = acc;
    workgroupBarrier();
    // the tree, unrolled (a checked loop of barriers is not)
{{TREE}}
    if (lid == 0u) {  // (reads only its own write: no barrier)
        emit(wg.z, s, row, {{COMBINE}}(part[0], part[1]));
    }
}

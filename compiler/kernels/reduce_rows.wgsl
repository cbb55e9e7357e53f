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
    for (var r = s * {{RS}}u + lid; r < end; r = r + 64u) {
        acc = {{COMBINE}}(acc, load(wg.z, row * {{R}}u + r));
    }
    part[lid] = acc;
    workgroupBarrier();
    for (var w = 32u; w > 0u; w = w >> 1u) {
        if (lid < w) {
            part[lid] = {{COMBINE}}(part[lid], part[lid + w]);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        emit(wg.z, s, row, part[0]);
    }
}

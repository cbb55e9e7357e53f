// First pass of a split row reduction: [OUTER, R, 1] with few rows and a long R. One
// workgroup per (row, slice) of RS elements, 64 threads striding over it, a tree in
// workgroup memory; partial[(z * S + s) * OUTER + row]. reduce_partials.wgsl sums the S
// slices. Layer z: which reduction.
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
        partial[(wg.z * {{S}}u + s) * {{OUTER}}u + row] = part[0];
    }
}

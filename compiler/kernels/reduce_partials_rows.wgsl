// Second pass of a split reduction with few outputs: one workgroup per output idx of
// reduction z, 64 threads striding over its S partials, then a tree in workgroup memory
// (a fixed order: deterministic). Stores through the kernel's store().
{{BINDINGS}}

var<workgroup> part: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = wg.x + wg.y * nwg.x;
    if (idx >= {{OUTPUTS}}u) {
        return;  // uniform across the workgroup
    }
    var acc = {{INIT}};
    for (var s = lid; s < {{S}}u; s = s + 64u) {
        acc = {{COMBINE}}(acc, partial[(wg.z * {{S}}u + s) * {{OUTPUTS}}u + idx]);
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
        store(wg.z, idx, part[0]);
    }
}

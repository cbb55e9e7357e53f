// Reduces the middle axis of [OUTER, R, 1]: one workgroup per output, 64 threads
// striding over R, then a tree in workgroup memory. Workgroup layer z: which reduction.
{{BINDINGS}}

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= {{OUTER}}u) {
        return;  // uniform across the workgroup
    }
    let base = row * {{R}}u;
    var acc = {{INIT}};
    for (var r = lid; r < {{R}}u; r = r + 64u) {
        acc = {{COMBINE}}(acc, load(wg.z, base + r));
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            partial[lid] = {{COMBINE}}(partial[lid], partial[lid + s]);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        store(wg.z, row, partial[0]);
    }
}

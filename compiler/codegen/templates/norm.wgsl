// Layer norm or RMS norm over the last D values of each row: one workgroup per row, the
// statistics by a tree in workgroup memory, then the normalised, scaled row in one pass.
// (As one kernel instead of the five its decomposition takes: reductions, centring, scaling.)
{{BINDINGS}}

var<workgroup> partial: array<f32, 64>;

fn row_sum(lid: u32, v: f32) -> f32 {
    partial[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            partial[lid] = partial[lid] + partial[lid + s];
        }
        workgroupBarrier();
    }
    let r = partial[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= {{ROWS}}u) {
        return;
    }
    let base = row * {{D}}u;
    var mean = 0.0;
    if ({{CENTRE}}) {
        var s = 0.0;
        for (var c = lid; c < {{D}}u; c = c + 64u) {
            s = s + src[base + c];
        }
        mean = row_sum(lid, s) / f32({{D}});
    }
    var q = 0.0;
    for (var c = lid; c < {{D}}u; c = c + 64u) {
        let d = src[base + c] - mean;
        q = q + d * d;
    }
    let inv = inverseSqrt(row_sum(lid, q) / f32({{D}}) + {{EPS}});
    for (var c = lid; c < {{D}}u; c = c + 64u) {
        let y = (src[base + c] - mean) * inv;
        dst[base + c] = {{AFFINE}};
    }
}

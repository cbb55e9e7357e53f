// Softmax or log-softmax over the last axis of [ROWS, COLS]: one workgroup per row.
{{BINDINGS}}

var<workgroup> partial: array<f32, 64>;

fn row_reduce(lid: u32, v: f32, is_max: bool) -> f32 {
    partial[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            let a = partial[lid];
            let b = partial[lid + s];
            partial[lid] = select(a + b, max(a, b), is_max);
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
    let base = row * {{COLS}}u;
    var m = -3.4028235e38;
    for (var c = lid; c < {{COLS}}u; c = c + 64u) {
        m = max(m, src[base + c]);
    }
    m = row_reduce(lid, m, true);
    var s = 0.0;
    for (var c = lid; c < {{COLS}}u; c = c + 64u) {
        s = s + exp(src[base + c] - m);
    }
    s = row_reduce(lid, s, false);
    let log_s = log(s);
    for (var c = lid; c < {{COLS}}u; c = c + 64u) {
        let z = src[base + c] - m;
        dst[base + c] = {{OUT_EXPR}};
    }
}

// Softmax or log-softmax over short rows (a few dozen columns): one thread per row, no
// workgroup memory. Per-pixel class scores have rows this short, and millions of them.
{{BINDINGS}}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * 64u;
    if (row >= {{ROWS}}u) {
        return;
    }
    let base = row * {{COLS}}u;
    var m = -3.4028235e38;
    for (var c = 0u; c < {{COLS}}u; c = c + 1u) {
        m = max(m, src[base + c]);
    }
    var s = 0.0;
    for (var c = 0u; c < {{COLS}}u; c = c + 1u) {
        s = s + exp(src[base + c] - m);
    }
    let log_s = log(s);
    for (var c = 0u; c < {{COLS}}u; c = c + 1u) {
        let z = src[base + c] - m;
        dst[base + c] = {{OUT_EXPR}};
    }
}

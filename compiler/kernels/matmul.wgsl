// C[b] = A[b] @ B[b], 64x64 output tile per workgroup of 256 threads, 4x4 outputs per
// thread held in four vec4 accumulators (private arrays indexed in loops are a 60x trap
// on NVIDIA). A and B are read through strides, so transposed operands and broadcast
// batches cost no copies; edges are guarded, so any M, N, K works.
{{BINDINGS}}

const M: u32 = {{M}}u;
const N: u32 = {{N}}u;
const K: u32 = {{K}}u;

var<workgroup> a_tile: array<vec4<f32>, 256>;  // [16 k][16 row groups of 4]
var<workgroup> b_tile: array<vec4<f32>, 256>;  // [16 k][16 col groups of 4]

fn load_a(off: u32, m: u32, k: u32) -> f32 {
    if (m < M && k < K) {
        return a[off + m * {{SAM}}u + k * {{SAK}}u];
    }
    return 0.0;
}

fn load_b(off: u32, k: u32, n: u32) -> f32 {
    if (k < K && n < N) {
        return b[off + k * {{SBK}}u + n * {{SBN}}u];
    }
    return 0.0;
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let batch = wg.z;
{{BATCH_OFFSETS}}
    let row0 = wg.y * 64u;
    let col0 = wg.x * 64u;
    let tid = lid.y * 16u + lid.x;
    // each thread stages one vec4 of A (4 rows at one k) and one of B (4 cols at one k)
    let lk = tid / 16u;
    let lg = tid % 16u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < K; k0 = k0 + 16u) {
        let m = row0 + lg * 4u;
        let k = k0 + lk;
        a_tile[tid] = vec4<f32>(load_a(a_off, m, k), load_a(a_off, m + 1u, k),
                                load_a(a_off, m + 2u, k), load_a(a_off, m + 3u, k));
        let n = col0 + lg * 4u;
        b_tile[tid] = vec4<f32>(load_b(b_off, k, n), load_b(b_off, k, n + 1u),
                                load_b(b_off, k, n + 2u), load_b(b_off, k, n + 3u));
        workgroupBarrier();
{{INNER_LOOP}}
        workgroupBarrier();
    }
    let out_row = row0 + lid.y * 4u;
    let out_col = col0 + lid.x * 4u;
    store_row(c_off, out_row, out_col, acc0);
    store_row(c_off, out_row + 1u, out_col, acc1);
    store_row(c_off, out_row + 2u, out_col, acc2);
    store_row(c_off, out_row + 3u, out_col, acc3);
}

fn store_row(off: u32, r: u32, c0: u32, v: vec4<f32>) {
    if (r >= M) {
        return;
    }
    let base = off + r * N;
    if (c0 < N) { c[base + c0] = v.x; }
    if (c0 + 1u < N) { c[base + c0 + 1u] = v.y; }
    if (c0 + 2u < N) { c[base + c0 + 2u] = v.z; }
    if (c0 + 3u < N) { c[base + c0 + 3u] = v.w; }
}

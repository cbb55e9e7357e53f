// Matmul variant for CPU rasterisers when both operands run along K in memory (x @ W^T,
// PyTorch's Linear layout): each invocation takes 4x4 outputs as dot products of vec4
// loads, which map onto the CPU's SIMD lanes; no workgroup memory, no barriers.
// Same split-K contract as igemm.wgsl (store() writes a result or a partial).
{{BINDINGS}}

const M: u32 = {{M}}u;
const N: u32 = {{N}}u;
const K: u32 = {{K}}u;
const SPLIT: u32 = {{SPLIT}}u;
const KS: u32 = {{KS}}u;

fn store(g: u32, slice: u32, m: u32, n: u32, v: f32) {
    if (m >= M || n >= N) {
        return;
    }
{{STORE}}
}

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wg: vec3<u32>) {
    let g = wg.z / SPLIT;
    let slice = wg.z % SPLIT;
    let r = gid.y * 4u;
    let c = gid.x * 4u;
    if (r >= M || c >= N) {
        return;
    }
{{OFFSETS}}
    // rows and columns past the edge read a valid neighbour; their results are never stored
    let a0 = a_off + min(r, M - 1u) * (K / 4u);
    let a1 = a_off + min(r + 1u, M - 1u) * (K / 4u);
    let a2 = a_off + min(r + 2u, M - 1u) * (K / 4u);
    let a3 = a_off + min(r + 3u, M - 1u) * (K / 4u);
    let b0 = b_off + min(c, N - 1u) * (K / 4u);
    let b1 = b_off + min(c + 1u, N - 1u) * (K / 4u);
    let b2 = b_off + min(c + 2u, N - 1u) * (K / 4u);
    let b3 = b_off + min(c + 3u, N - 1u) * (K / 4u);
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    let k_end = min(K, (slice + 1u) * KS) / 4u;
    for (var k = slice * KS / 4u; k < k_end; k = k + 1u) {
        let x0 = a[a0 + k];
        let x1 = a[a1 + k];
        let x2 = a[a2 + k];
        let x3 = a[a3 + k];
        let y0 = b[b0 + k];
        let y1 = b[b1 + k];
        let y2 = b[b2 + k];
        let y3 = b[b3 + k];
        acc0 = acc0 + vec4<f32>(dot(x0, y0), dot(x0, y1), dot(x0, y2), dot(x0, y3));
        acc1 = acc1 + vec4<f32>(dot(x1, y0), dot(x1, y1), dot(x1, y2), dot(x1, y3));
        acc2 = acc2 + vec4<f32>(dot(x2, y0), dot(x2, y1), dot(x2, y2), dot(x2, y3));
        acc3 = acc3 + vec4<f32>(dot(x3, y0), dot(x3, y1), dot(x3, y2), dot(x3, y3));
    }
    store(g, slice, r, c, acc0.x); store(g, slice, r, c + 1u, acc0.y); store(g, slice, r, c + 2u, acc0.z); store(g, slice, r, c + 3u, acc0.w);
    store(g, slice, r + 1u, c, acc1.x); store(g, slice, r + 1u, c + 1u, acc1.y); store(g, slice, r + 1u, c + 2u, acc1.z); store(g, slice, r + 1u, c + 3u, acc1.w);
    store(g, slice, r + 2u, c, acc2.x); store(g, slice, r + 2u, c + 1u, acc2.y); store(g, slice, r + 2u, c + 2u, acc2.z); store(g, slice, r + 2u, c + 3u, acc2.w);
    store(g, slice, r + 3u, c, acc3.x); store(g, slice, r + 3u, c + 1u, acc3.y); store(g, slice, r + 3u, c + 2u, acc3.z); store(g, slice, r + 3u, c + 3u, acc3.w);
}

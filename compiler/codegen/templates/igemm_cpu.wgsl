// Implicit GEMM, variant for CPU rasterisers (lavapipe): no workgroup memory and no
// barriers, which such devices emulate slowly; each invocation reads its operands straight
// from memory (the CPU's caches do the tiling) for 4x4 outputs. Several times faster than
// igemm.wgsl on llvmpipe (bench/REJECTED.md). Same contract as igemm.wgsl; four vec4 accumulators (private arrays indexed in loops are a 60x trap on
// NVIDIA). The operands are never materialised: load_a / load_b compute where each
// element lives (a strided matrix for matmul; an im2col window for convolutions), and
// store writes each result (where epilogues go). Edges are guarded: any M, N, K works.
{{COMMON}}
@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wg: vec3<u32>) {
    let g = wg.z / SPLIT;
    let slice = wg.z % SPLIT;
    let k_end = min(K, (slice + 1u) * KS);
    let r = gid.y * 4u;
    let c = gid.x * 4u;
    if (r >= M || c >= N) {
        return;
    }
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k = slice * KS; k < k_end; k = k + 1u) {
        let bv = vec4<f32>(load_b(g, k, c), load_b(g, k, c + 1u), load_b(g, k, c + 2u), load_b(g, k, c + 3u));
        acc0 = acc0 + load_a(g, r, k) * bv;
        acc1 = acc1 + load_a(g, r + 1u, k) * bv;
        acc2 = acc2 + load_a(g, r + 2u, k) * bv;
        acc3 = acc3 + load_a(g, r + 3u, k) * bv;
    }
    store(g, slice, r, c, acc0.x); store(g, slice, r, c + 1u, acc0.y); store(g, slice, r, c + 2u, acc0.z); store(g, slice, r, c + 3u, acc0.w);
    store(g, slice, r + 1u, c, acc1.x); store(g, slice, r + 1u, c + 1u, acc1.y); store(g, slice, r + 1u, c + 2u, acc1.z); store(g, slice, r + 1u, c + 3u, acc1.w);
    store(g, slice, r + 2u, c, acc2.x); store(g, slice, r + 2u, c + 1u, acc2.y); store(g, slice, r + 2u, c + 2u, acc2.z); store(g, slice, r + 2u, c + 3u, acc2.w);
    store(g, slice, r + 3u, c, acc3.x); store(g, slice, r + 3u, c + 1u, acc3.y); store(g, slice, r + 3u, c + 2u, acc3.z); store(g, slice, r + 3u, c + 3u, acc3.w);
}

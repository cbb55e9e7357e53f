// Implicit GEMM, variant for CPU rasterisers (lavapipe): no workgroup memory and no
// barriers, which such devices emulate slowly. Each invocation reads its operands straight
// from memory for ROWS x COLS outputs, ROWS + COLS reads for ROWS * COLS multiply-adds: on
// lavapipe a storage-buffer read costs ~40x a multiply-add (it loops over the SIMD lanes), so
// big products take big tiles; small ones 4x4, which LLVM compiles several times faster
// (codegen/gemm.py, CPU_BIG_TILES_FROM). Same contract as igemm.wgsl; the accumulators are
// written out as named vec4s (acc{row}_{quad}), since wgpu's loop counters keep drivers from
// unrolling loops over a private array. The operands are never materialised: load_a / load_b
// compute where each element lives (a strided matrix for matmul; an im2col window for
// convolutions), and store writes each result (where epilogues go). Edges are guarded: any
// M, N, K works. A row of 8 lanes is one subgroup: A's values, the same for all of them, are
// each read by one lane and broadcast. Where A and B both lie along K (a linear layer), a big
// product's step reads 4 k at once (load_a4 / load_b4): a quarter of the reads.
{{COMMON}}
@compute @workgroup_size(8, {{WY}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let g = wg.z / SPLIT;
    let slice = wg.z % SPLIT;
    let k_end = min(K, (slice + 1u) * KS);
    let r = gid.y * {{ROWS}}u;
    if (r >= M) {  // (a whole row of 8 lanes, one subgroup, leaves together)
        return;
    }
    // a lane past the last column still runs the loop (the broadcasts need every lane), its
    // own reads and stores skipped
    let lane = lid.x;
    let c = gid.x * {{COLS}}u;
{{ACC_DECL}}
    for (var k = slice * KS; k < k_end; k = k + {{KSTEP}}u) {
{{STEP}}
    }
    if (c < N) {
{{STORE_ALL}}
    }
}

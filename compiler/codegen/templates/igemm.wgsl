// Implicit GEMM: C[g] = A[g] @ B[g] for g in [0, GROUPS), with M x N outputs and a K
// reduction. A TILE x TILE output tile per workgroup of TG x TG threads (64: 16 x 16;
// 32: 8 x 8, for shapes whose 64-tiles leave SMs idle), 4x4 outputs per thread
// held in four vec4 accumulators (private arrays indexed in loops are a 60x trap on
// NVIDIA). The operands are never materialised: load_a / load_b compute where each
// element lives (a strided matrix for matmul; an im2col window for convolutions), and
// store writes each result (where epilogues go). Edges are guarded where a tile or K step may
// cross them (codegen/gemm.py, edge_guards): any M, N, K works.
{{COMMON}}
const TG: u32 = {{TG}}u;
const TILE: u32 = 4u * TG;
var<workgroup> a_tile: {{TILE_TYPE}};  // [16 k][TG row groups of 4]
var<workgroup> b_tile: {{TILE_TYPE}};  // [16 k][TG col groups of 4]

@compute @workgroup_size({{TG}}, {{TG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let g = wg.z / SPLIT;
    let slice = wg.z % SPLIT;
    let k_end = min(K, (slice + 1u) * KS);
    let row0 = wg.y * TILE;
    let col0 = wg.x * TILE;
    let tid = lid.y * TG + lid.x;
    let tx = lid.x;
    let ty = lid.y;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    // each K step, each thread stages vec4s of A (4 rows at one k, or 4 k of one row) and of B
    // ({{A_ORDER}} for A, {{B_ORDER}} for B, so that a warp's loads walk the operand's
    // contiguous dimension): tile entries e = tid, tid + TG * TG, ... below 16 TG.{{STEPS_NOTE}}
    for (var k0 = slice * KS; k0 < k_end; k0 = k0 + 16u) {
{{LOOP_BODY}}
    }
    let r = row0 + ty * 4u;
    let c = col0 + tx * 4u;
    store4(g, slice, r, c, acc0);
    store4(g, slice, r + 1u, c, acc1);
    store4(g, slice, r + 2u, c, acc2);
    store4(g, slice, r + 3u, c, acc3);
}

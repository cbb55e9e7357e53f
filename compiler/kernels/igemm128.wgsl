// Implicit GEMM, large-tile variant: a 128x128 output tile per workgroup of 256 threads,
// 8x8 outputs per thread in sixteen vec4 accumulators (see igemm.wgsl for the contract).
// Chosen for large M and N, where the wider tile halves the loads per multiply-add.
// Accumulators (private arrays indexed in loops are a 60x trap on
// NVIDIA). The operands are never materialised: load_a / load_b compute where each
// element lives (a strided matrix for matmul; an im2col window for convolutions), and
// store writes each result (where epilogues go). Edges are guarded: any M, N, K works.
// K advances BK at a time; {{PREFETCH_NOTE}}
{{COMMON}}
const BK: u32 = {{BK}}u;
var<workgroup> a_tile: array<vec4<f32>, {{STAGED}}>;  // [BK k][32 row groups of 4]
var<workgroup> b_tile: array<vec4<f32>, {{STAGED}}>;  // [BK k][32 col groups of 4]

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let g = wg.z / SPLIT;
    let slice = wg.z % SPLIT;
    let k_end = min(K, (slice + 1u) * KS);
    let row0 = wg.y * 128u;
    let col0 = wg.x * 128u;
    let tid = lid.y * 16u + lid.x;
    // the tile entries (k, group of 4) this thread stages: {{A_ORDER}} for A, {{B_ORDER}} for B,
    // so that a warp's loads walk the operand's contiguous dimension
{{INDEX}}
{{ACC_DECL}}
    var k0 = slice * KS;
{{LOAD_FIRST}}
    for (; k0 < k_end; k0 = k0 + BK) {
{{STORE_TILES}}
        workgroupBarrier();
{{LOAD_NEXT}}
{{INNER_LOOP}}
        workgroupBarrier();
    }
    let r = row0 + lid.y * {{ROW_STEP}}u;
    let c = col0 + lid.x * {{COL_STEP}}u;
{{STORES}}
}

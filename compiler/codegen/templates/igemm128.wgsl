// Implicit GEMM, register-blocked variant: a 128 x 128 output tile per workgroup of
// 16 x 16 threads, 8x8 outputs per thread in sixteen vec4
// accumulators (see igemm.wgsl for the contract): twice the multiply-adds per workgroup-memory
// load of igemm.wgsl's 4x4. Chosen for large M and N.
// Accumulators (private arrays indexed in loops are a 60x trap on
// NVIDIA). The operands are never materialised: load_a / load_b compute where each
// element lives (a strided matrix for matmul; an im2col window for convolutions), and
// store writes each result (where epilogues go). Edges are guarded where a tile or K step may
// cross them (codegen/gemm.py, edge_guards): any M, N, K works.
// K advances BK at a time; the next tile's global loads are issued before this tile's multiply-adds.{{STEPS_NOTE}}
{{COMMON}}
const BK: u32 = {{BK}}u;
const STAGED: u32 = {{STAGED}}u;
// one buffer of [BK k][32 row (A) / column (B) groups of 4]
var<workgroup> a_tile: {{A_TILE_TYPE}};
var<workgroup> b_tile: {{B_TILE_TYPE}};

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let g = wg.z / SPLIT;
    let slice = wg.z % SPLIT;
    let k_end = min(K, (slice + 1u) * KS);
    let row0 = wg.y * 128u;
    let col0 = wg.x * 128u;
    let tid = lid.y * 16u + lid.x;
    let tx = lid.x;
    let ty = lid.y;
    // the tile entries (k, group of 4) this thread stages: {{A_ORDER}} for A, {{B_ORDER}} for B,
    // so that a warp's loads walk the operand's contiguous dimension
{{INDEX}}
    var acc0l = vec4<f32>(0.0);
    var acc0h = vec4<f32>(0.0);
    var acc1l = vec4<f32>(0.0);
    var acc1h = vec4<f32>(0.0);
    var acc2l = vec4<f32>(0.0);
    var acc2h = vec4<f32>(0.0);
    var acc3l = vec4<f32>(0.0);
    var acc3h = vec4<f32>(0.0);
    var acc4l = vec4<f32>(0.0);
    var acc4h = vec4<f32>(0.0);
    var acc5l = vec4<f32>(0.0);
    var acc5h = vec4<f32>(0.0);
    var acc6l = vec4<f32>(0.0);
    var acc6h = vec4<f32>(0.0);
    var acc7l = vec4<f32>(0.0);
    var acc7h = vec4<f32>(0.0);
    var k0 = slice * KS;
{{LOAD_FIRST}}

    for (; k0 < k_end; k0 = k0 + BK) {
{{LOOP_BODY}}
    }
    let r = row0 + ty * 8u;
    let c = col0 + tx * 4u;
    store4(g, slice, r + 0u, c + 0u, acc0l);
    store4(g, slice, r + 0u, c + 64u, acc0h);
    store4(g, slice, r + 1u, c + 0u, acc1l);
    store4(g, slice, r + 1u, c + 64u, acc1h);
    store4(g, slice, r + 2u, c + 0u, acc2l);
    store4(g, slice, r + 2u, c + 64u, acc2h);
    store4(g, slice, r + 3u, c + 0u, acc3l);
    store4(g, slice, r + 3u, c + 64u, acc3h);
    store4(g, slice, r + 4u, c + 0u, acc4l);
    store4(g, slice, r + 4u, c + 64u, acc4h);
    store4(g, slice, r + 5u, c + 0u, acc5l);
    store4(g, slice, r + 5u, c + 64u, acc5h);
    store4(g, slice, r + 6u, c + 0u, acc6l);
    store4(g, slice, r + 6u, c + 64u, acc6h);
    store4(g, slice, r + 7u, c + 0u, acc7l);
    store4(g, slice, r + 7u, c + 64u, acc7h);
}

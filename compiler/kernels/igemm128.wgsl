// Implicit GEMM, register-blocked variant: a TILE x TILE output tile (128, or 64) per
// workgroup of TG x TG threads (16 x 16, or 8 x 8), 8x8 outputs per thread in sixteen vec4
// accumulators (see igemm.wgsl for the contract): twice the multiply-adds per workgroup-memory
// load of igemm.wgsl's 4x4. Chosen for large M and N.
// Accumulators (private arrays indexed in loops are a 60x trap on
// NVIDIA). The operands are never materialised: load_a / load_b compute where each
// element lives (a strided matrix for matmul; an im2col window for convolutions), and
// store writes each result (where epilogues go). Edges are guarded where a tile or K step may
// cross them (codegen_gemm.edge_guards): any M, N, K works.
// K advances BK at a time; {{PREFETCH_NOTE}}{{STEPS_NOTE}}
{{COMMON}}
const BK: u32 = {{BK}}u;
const STAGED: u32 = {{STAGED}}u;
// {{BUFFERS}} of [BK k][{{GROUPS}} row (A) / column (B) groups of 4]
var<workgroup> a_tile: {{A_TILE_TYPE}};
var<workgroup> b_tile: {{B_TILE_TYPE}};

@compute @workgroup_size({{TG}}, {{TG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let g = wg.z / SPLIT;
    let slice = wg.z % SPLIT;
    let k_end = min(K, (slice + 1u) * KS);
    let row0 = wg.y * {{TILE}}u;
    let col0 = wg.x * {{TILE}}u;
    let tid = lid.y * {{TG}}u + lid.x;
{{THREAD_XY}}
    // the tile entries (k, group of 4) this thread stages: {{A_ORDER}} for A, {{B_ORDER}} for B,
    // so that a warp's loads walk the operand's contiguous dimension
{{INDEX}}
{{ACC_DECL}}
    var k0 = slice * KS;
{{LOAD_FIRST}}
{{BEFORE_LOOP}}
    for (; k0 < k_end; k0 = k0 + BK) {
{{LOOP_BODY}}
    }
    let r = row0 + ty * {{ROW_STEP}}u;
    let c = col0 + tx * {{COL_STEP}}u;
{{STORES}}
}

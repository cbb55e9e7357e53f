// Standalone experimental GEMM for bench/gemm_ceiling.py (not used by the compiler): C = A @ B,
// A [M, K] and B [K, N] row-major, every size a multiple of the tile (no edge guards).
// A TM x TN tile per workgroup of 256 threads, RM x RN outputs per thread as vec4 column
// groups, BK k per step, the next step's global loads held in registers while this one multiplies.
const M: u32 = {{M}}u;
const N: u32 = {{N}}u;
const K: u32 = {{K}}u;
const BK: u32 = {{BK}}u;
@group(0) @binding(0) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> c: array<vec4<f32>>;
// [BK k][TM / 4 row groups] and [BK k][TN / 4 column groups]
var<workgroup> a_tile: array<vec4<f32>, {{A_STAGED}}>;
var<workgroup> b_tile: array<vec4<f32>, {{B_STAGED}}>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let row0 = wg.y * {{TM}}u;
    let col0 = wg.x * {{TN}}u;
{{THREAD_XY}}
{{INDEX}}
{{ACC_DECL}}
    var k0 = 0u;
{{LOAD_FIRST}}
    for (; k0 < K; k0 = k0 + BK) {
{{STORE_TILES}}
        workgroupBarrier();
        if (k0 + BK < K) {
{{LOAD_NEXT}}
        }
{{INNER}}
        workgroupBarrier();
    }
{{STORES}}
}

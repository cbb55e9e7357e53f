// Fused attention forward, variant for CPU rasterisers (lavapipe): ROWS query rows per
// invocation, so that each key and value row read from memory serves ROWS queries. A
// storage-buffer read costs there ~40x a multiply-add (it loops over the SIMD lanes), and
// workgroup memory is read the same way, so sharing keys through it gains nothing
// (bench/REJECTED.md). A workgroup is one subgroup of 8 lanes, all reading the same key:
// each of its vec4s is read by one lane and broadcast. Same bindings, key split and outputs as
// attention.wgsl; the rows' state is written out per row (q{i}_{c}, acc{i}_{c}, m{i}, l{i}).
{{BINDINGS}}

{{HEAD}}
const ROWS: u32 = {{ROWS}}u;
const WG_ROWS: u32 = 8u * ROWS;  // a workgroup's query rows

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let bh = wg.y;                      // batch * H + head
    let split = wg.z;
    let b = bh / H;
    let h = bh % H;
    let first = wg.x * WG_ROWS + lid * ROWS;
    let k_base = b * {{KSB}}u + (h / REP) * {{KSH}}u;
    let v_base = b * {{VSB}}u + (h / REP) * {{VSH}}u;
{{ROW_SETUP}}
    let wg_last = select(T, min(T, min(wg.x * WG_ROWS + WG_ROWS - 1u, S - 1u) + (T - S) + 1u), CAUSAL);
    let j_end = min(wg_last, (split + 1u) * KL);
    for (var j = split * KL; j < j_end; j = j + 1u) {
{{KEY_LOAD}}
{{ROW_UPDATE}}
    }
{{ROW_STORE}}
}

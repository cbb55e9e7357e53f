// Fused attention forward: softmax(q k^T * scale + causal mask) v for one query row per
// thread, with an online softmax, so the [tokens x tokens] scores never exist in memory.
// A workgroup's 64 query rows share each tile of TILE keys and values staged in workgroup
// memory ({{SHARED}}: CPU rasterisers read them straight from memory instead).
// q [B, H, S, D], k and v [B, HK, T, D] (grouped-query: query head h reads kv head h / REP),
// out [B, H, S, D]; D = 4 * DV4.
// Sizes stay written in (compiler/lift_sizes.py): the inner loops divide by them.
{{BINDINGS}}

{{HEAD}}
const TILE: u32 = {{TILE}}u;  // 32, or fewer for wide heads (codegen/attention.py, SHARED_BUDGET)

var<workgroup> k_tile: {{TILE_TYPE}};
var<workgroup> v_tile: {{TILE_TYPE}};

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let bh = wg.y;                      // batch * H + head
    let split = wg.z;
    let b = bh / H;
    let h = bh % H;
    let row = wg.x * 64u + lid;
    let live = row < S;
    let qrow = min(row, S - 1u);
    let q_base = b * {{QSB}}u + h * {{QSH}}u + qrow * {{QST}}u;
    let k_base = b * {{KSB}}u + (h / REP) * {{KSH}}u;
    let v_base = b * {{VSB}}u + (h / REP) * {{VSH}}u;
{{Q_LOAD}}
    var m = -3.4028235e38;
    var l = 0.0;
{{ACC_DECL}}
    let last = select(T, min(T, qrow + (T - S) + 1u), CAUSAL);  // keys this row may see
    let wg_last = select(T, min(T, min(wg.x * 64u + 63u, S - 1u) + (T - S) + 1u), CAUSAL);
    let j_end = min(wg_last, (split + 1u) * KL);
    for (var j0 = split * KL; j0 < j_end; j0 = j0 + TILE) {
{{STAGE}}
        let n = min(TILE, j_end - j0);
        for (var jj = 0u; jj < n; jj = jj + 1u) {
            let j = j0 + jj;
{{SCORE}}
            if (!CAUSAL || j < last) {  // (no check at all without a mask: j < j_end <= T)
                let m2 = max(m, s);
                let corr = exp(m - m2);
                let p = exp(s - m2);
                l = l * corr + p;
                m = m2;
{{ACC_UPDATE}}
            }
        }
{{STAGE_END}}
    }
    if (live) {
{{STORE}}
    }
}

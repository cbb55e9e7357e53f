// Attention backward, query side (FlashAttention-2's dQ pass): for one block of BQ query
// rows of one head, dQ = scale * sum_j dS_ij k_j with dS = P * (dP - D), P = exp(s - lse)
// recomputed from the forward's log-sum-exp and dP = dO v^T, one block of BK keys at a time:
// the [tokens x tokens] matrices exist only as one BQ x BK tile in workgroup memory.
// Also writes D = rowsum(dO * O) per row (`delta`) for the key-side kernel that follows.
// NT threads as TY x TX (16 x 16, or 8 wide for small blocks): a thread owns query rows
// ty * RT + r (both phases) and key columns tx + TX c of the tile (interleaved, so that
// neighbouring threads read neighbouring tile rows, which the padded row stride STR puts in
// different banks).
// Sizes stay written in (compiler/lift_sizes.py): the inner loops divide by them.
{{BINDINGS}}

const S: u32 = {{S}}u;
const T: u32 = {{T}}u;
const H: u32 = {{H}}u;
const REP: u32 = {{REP}}u;
const DV4: u32 = {{DV4}}u;
const STR: u32 = {{STR}}u;  // vec4s per tile row: DV4 + 1
const SCALE: f32 = {{SCALE}};
const CAUSAL: bool = {{CAUSAL}};
const WANT_DQ: bool = {{WANT_DQ}};  // else only D
const BQ: u32 = {{BQ}}u;
const BK: u32 = {{BK}}u;
const NT: u32 = {{NT}}u;  // threads, TY x TX
const TX: u32 = {{TX}}u;
const RT: u32 = {{RT}}u;  // BQ / TY
const KC: u32 = {{KC}}u;  // keys per chunk: a multiple of BK

var<workgroup> q_t: {{QD_TILE}};
var<workgroup> do_t: {{QD_TILE}};
var<workgroup> k_t: {{KV_TILE}};
var<workgroup> v_t: {{KV_TILE}};
var<workgroup> ds_t: {{DS_TILE}};
var<workgroup> d_t: array<f32, {{BQ}}>;
var<workgroup> lse_t: array<f32, {{BQ}}>;

{{LOADERS}}

@compute @workgroup_size({{NT}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let bh = wg.y;  // batch * H + head
    let b = bh / H;
    let h = bh % H;
    let i0 = wg.x * BQ;
    let q_base = b * {{QSB}}u + h * {{QSH}}u;
    let do_base = b * {{DSB}}u + h * {{DSH}}u;
    let o_base = b * {{OSB}}u + h * {{OSH}}u;
    let k_base = b * {{KSB}}u + (h / REP) * {{KSH}}u;
    let v_base = b * {{VSB}}u + (h / REP) * {{VSH}}u;
    for (var e = lid; e < BQ * DV4; e = e + NT) {
        let r = e / DV4;
        let c = e % DV4;
        let i = min(i0 + r, S - 1u);  // rows past the end repeat the last one; never stored
        q_t[r][c] = q4(q_base + i * {{QST}}u, c);
        do_t[r][c] = do4(do_base + i * {{DST}}u, c);
    }
    workgroupBarrier();
    if (lid < BQ) {
        let i = min(i0 + lid, S - 1u);
        var acc = 0.0;
        for (var c = 0u; c < DV4; c = c + 1u) {
            acc = acc + dot(do_t[lid][c], o4(o_base + i * {{OST}}u, c));
        }
        d_t[lid] = acc;
        lse_t[lid] = lse[bh * S + i];
        if (i0 + lid < S && wg.z == 0u) {
            delta[bh * S + i0 + lid] = acc;
        }
    }
    let ty = lid / TX;
    let tx = lid % TX;
{{ACC_DECL}}
    let i_last = min(i0 + BQ, S) - 1u;
    let j_end = select(0u, select(T, min(T, i_last + (T - S) + 1u), CAUSAL), WANT_DQ);  // keys the last row sees
    let j_begin = wg.z * KC;  // this workgroup's chunk of the keys (all of them unless split)
    for (var j0 = j_begin; j0 < min(j_end, j_begin + KC); j0 = j0 + BK) {
        workgroupBarrier();  // the last step's readers of k_t and ds_t are done (first: d_t is written)
        for (var e = lid; e < BK * DV4; e = e + NT) {
            let r = e / DV4;
            let c = e % DV4;
            let j = min(j0 + r, T - 1u);
            k_t[r][c] = k4(k_base + j * {{KST}}u, c);
            v_t[r][c] = v4(v_base + j * {{VST}}u, c);
        }
        workgroupBarrier();
{{TILE}}
        workgroupBarrier();
        // dQ += dS[:, jj] k[jj] for jj < BK, a block per jj
{{DQ_STEPS}}
    }
{{STORE}}
}

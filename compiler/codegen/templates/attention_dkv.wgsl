// Attention backward, key side (FlashAttention-2's dK/dV pass): for one block of BC keys of
// one key/value head, loop over the query blocks (BR rows) of every query head of its group,
// recompute P = exp(s - lse) and dS = P * (dP - D) for the BR x BC tile, and accumulate
// dV += P^T dO and dK += scale * dS^T Q in registers. Summing the group's query heads here is
// what grouped-query attention's dK and dV are; no atomics, no [tokens x tokens] in memory.
// NT threads as TY x TX (16 x 16, or 8 wide for small blocks): in the tile, a thread owns
// query rows ty * RT + r and key columns tx + TX c; for dK and dV, key rows ty * RJ + r and
// vec4 columns tx + TX n.
// Sizes stay written in (compiler/lift_sizes.py): the inner loops divide by them.
{{BINDINGS}}

const S: u32 = {{S}}u;
const T: u32 = {{T}}u;
const H: u32 = {{H}}u;
const HK: u32 = {{HK}}u;
const REP: u32 = {{REP}}u;
const DV4: u32 = {{DV4}}u;
const STR: u32 = {{STR}}u;  // vec4s per tile row: DV4 + 1
const SCALE: f32 = {{SCALE}};
const CAUSAL: bool = {{CAUSAL}};
const BC: u32 = {{BC}}u;
const BR: u32 = {{BR}}u;
const NT: u32 = {{NT}}u;  // threads, TY x TX
const TX: u32 = {{TX}}u;
const RT: u32 = {{RT}}u;  // BR / TY
const RJ: u32 = {{RJ}}u;  // BC / TY
const QC: u32 = {{QC}}u;  // queries per chunk: a multiple of BR

var<workgroup> k_t: {{KV_TILE}};
var<workgroup> v_t: {{KV_TILE}};
var<workgroup> q_t: {{QD_TILE}};
var<workgroup> do_t: {{QD_TILE}};
var<workgroup> p_t: {{P_TILE}};
var<workgroup> ds_t: {{P_TILE}};

{{LOADERS}}

@compute @workgroup_size({{NT}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let bhk = wg.y;  // batch * HK + key/value head
    let b = bhk / HK;
    let hk = bhk % HK;
    let j0 = wg.x * BC;
    let k_base = b * {{KSB}}u + hk * {{KSH}}u;
    let v_base = b * {{VSB}}u + hk * {{VSH}}u;
    for (var e = lid; e < BC * DV4; e = e + NT) {
        let r = e / DV4;
        let c = e % DV4;
        let j = min(j0 + r, T - 1u);  // keys past the end repeat the last one; never stored
        k_t[r][c] = k4(k_base + j * {{KST}}u, c);
        v_t[r][c] = v4(v_base + j * {{VST}}u, c);
    }
    let ty = lid / TX;
    let tx = lid % TX;
{{ACC_DECL}}
    // causal: query i sees key j when j <= i + (T - S); the block's first key rules out earlier rows
    let off = T - S;
    let i_first = select(0u, ((max(j0, off) - off) / BR) * BR, CAUSAL);
    let q_begin = wg.z * QC;  // this workgroup's chunk of the queries (all of them unless split)
    for (var g = 0u; g < REP; g = g + 1u) {
        let bh = b * H + hk * REP + g;
        let q_base = b * {{QSB}}u + (hk * REP + g) * {{QSH}}u;
        let do_base = b * {{DSB}}u + (hk * REP + g) * {{DSH}}u;
        for (var i0 = max(i_first, q_begin); i0 < min(S, q_begin + QC); i0 = i0 + BR) {
            workgroupBarrier();  // the last step's readers of q_t, do_t, p_t, ds_t are done
            for (var e = lid; e < BR * DV4; e = e + NT) {
                let r = e / DV4;
                let c = e % DV4;
                let i = min(i0 + r, S - 1u);
                q_t[r][c] = q4(q_base + i * {{QST}}u, c);
                do_t[r][c] = do4(do_base + i * {{DST}}u, c);
            }
            workgroupBarrier();
{{TILE}}
            workgroupBarrier();
            // dV += P[ii, :] dO[ii], dK += dS[ii, :] q[ii] for ii < BR, a block per ii
{{DKV_STEPS}}
        }
    }
{{STORE}}
}

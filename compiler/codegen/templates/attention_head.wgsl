// What the forward attention kernels share (attention.wgsl, attention_cpu.wgsl): their sizes
// and the reads of a key's and a value's 4 values c at token j.
const S: u32 = {{S}}u;
const T: u32 = {{T}}u;
const H: u32 = {{H}}u;
const HK: u32 = {{HK}}u;
const REP: u32 = {{REP}}u;
const DV4: u32 = {{DV4}}u;
const SCALE: f32 = {{SCALE}};
const CAUSAL: bool = {{CAUSAL}};
const SPLIT: u32 = {{SPLIT}}u;  // keys cut into SPLIT ranges of KL, merged by a second kernel
const KL: u32 = {{KL}}u;

// q, k and v are read through strides (batch, head, token; the head dim is contiguous), so
// a [b, t, h, d] -> [b, h, t, d] transpose in front of attention costs no copy
fn k4(base: u32, j: u32, c: u32) -> vec4<f32> {
    let o = base + j * {{KST}}u + c * 4u;
    return {{K4}};
}

fn v4(base: u32, j: u32, c: u32) -> vec4<f32> {
    let o = base + j * {{VST}}u + c * 4u;
    return {{V4}};
}

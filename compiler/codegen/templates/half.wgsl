
// {{NAME}} holds f16 values two to a u32 (passes/half_weights.py); widened to f32 when read
// with unpack2x16float, core WGSL: no device feature needed
fn {{NAME}}_at(i: u32) -> f32 {
    let pair = unpack2x16float({{NAME}}[i >> 1u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

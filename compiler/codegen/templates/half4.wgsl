
// {{NAME}} holds f16 values four to a vec2<u32> (passes/half_weights.py): entry i is the
// 4 values from 4 * i, widened to f32
fn {{NAME}}_at4(i: u32) -> vec4<f32> {
    let quad = {{NAME}}[i];
    return vec4<f32>(unpack2x16float(quad.x), unpack2x16float(quad.y));
}

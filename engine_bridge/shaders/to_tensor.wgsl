// A texture -> a normalised model input, written straight into the Session's input buffer.
// One thread per output pixel: bilinear resize of the crop (half-pixel centres, edges
// clamped: PyTorch's interpolate(mode="bilinear", align_corners=False)), channel pick,
// (value - mean) / std, stored at base + y*stride.y + x*stride.x + c*stride.z.
// CPU reference: engine_bridge/texture_io.py, preprocess_reference().

struct Params {
    mean: vec4<f32>,
    inv_std: vec4<f32>,
    stride: vec4<u32>,      // x, y, channel, base (in f32 elements)
    pick: vec4<u32>,        // which texture channel (r, g, b, a = 0..3) feeds output channel c
    origin: vec2<f32>,      // crop origin, texels
    scale: vec2<f32>,       // crop size / output size
    crop_max: vec2<f32>,    // crop size - 1
    out_size: vec2<u32>,    // output width, height
    channels: u32,
};

@group(0) @binding(0) var src: texture_2d<f32>;
@group(0) @binding(1) var<uniform> P: Params;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

fn texel(x: f32, y: f32) -> vec4<f32> {
    return textureLoad(src, vec2<i32>(i32(x), i32(y)), 0);
}

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x >= P.out_size.x || id.y >= P.out_size.y) {
        return;
    }
    let s = max((vec2<f32>(id.xy) + 0.5) * P.scale - 0.5, vec2<f32>(0.0));
    let f = floor(s);
    let w = s - f;
    let p0 = min(f, P.crop_max) + P.origin;
    let p1 = min(f + 1.0, P.crop_max) + P.origin;
    let top = texel(p0.x, p0.y) * (1.0 - w.x) + texel(p1.x, p0.y) * w.x;
    let bottom = texel(p0.x, p1.y) * (1.0 - w.x) + texel(p1.x, p1.y) * w.x;
    var v = top * (1.0 - w.y) + bottom * w.y;
    let at = P.stride.w + id.y * P.stride.y + id.x * P.stride.x;
    for (var c = 0u; c < P.channels; c++) {
        dst[at + c * P.stride.z] = (v[P.pick[c]] - P.mean[c]) * P.inv_std[c];
    }
}

// A model output -> an overlay texture: per pixel, argmax over classes (first maximum,
// as numpy) -> that class's colour with alpha. One class means a mask: value > threshold.
// Reads the Session's output buffer at base + y*stride.y + x*stride.x + c*stride.z.
// CPU reference: engine_bridge/texture_io.py, overlay_reference().

struct Params {
    stride: vec4<u32>,      // x, y, class, base (in f32 elements)
    size: vec2<u32>,        // width, height
    classes: u32,
    threshold: f32,
};

@group(0) @binding(0) var<storage, read> scores: array<f32>;
@group(0) @binding(1) var<storage, read> palette: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> P: Params;
@group(0) @binding(3) var out: texture_storage_2d<rgba8unorm, write>;

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x >= P.size.x || id.y >= P.size.y) {
        return;
    }
    let at = P.stride.w + id.y * P.stride.y + id.x * P.stride.x;
    var best = 0u;
    if (P.classes == 1u) {
        best = select(0u, 1u, scores[at] > P.threshold);
    } else {
        var top = scores[at];
        for (var c = 1u; c < P.classes; c++) {
            let v = scores[at + c * P.stride.z];
            if (v > top) {
                top = v;
                best = c;
            }
        }
    }
    textureStore(out, vec2<i32>(id.xy), palette[best]);
}

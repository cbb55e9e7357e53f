// Draw a texture over the whole target (or the viewport set by the caller): one
// full-screen triangle. The pipeline's blend state decides copy (background) or
// alpha blend (overlay).

struct VOut {
    @builtin(position) pos: vec4<f32>,
    @location(0) uv: vec2<f32>,
};

@vertex
fn vs(@builtin(vertex_index) i: u32) -> VOut {
    let p = vec2<f32>(f32((i << 1u) & 2u), f32(i & 2u));
    var o: VOut;
    o.pos = vec4<f32>(p * 2.0 - 1.0, 0.0, 1.0);
    o.uv = vec2<f32>(p.x, 1.0 - p.y);
    return o;
}

@group(0) @binding(0) var tex: texture_2d<f32>;
@group(0) @binding(1) var smp: sampler;

@fragment
fn fs(v: VOut) -> @location(0) vec4<f32> {
    return textureSampleLevel(tex, smp, v.uv, 0.0);
}

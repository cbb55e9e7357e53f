// The HUD: lines of text from a small glyph atlas, over a translucent box, drawn into the
// frame by one full-screen triangle (fragments outside the box are discarded).
struct Params {
    origin: vec2<f32>,   // top-left of the box, in pixels
    cell: vec2<f32>,     // glyph cell size on screen, in pixels
    cols: u32,
    rows: u32,
    glyph: vec2<u32>,    // glyph cell size in the atlas
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> text: array<u32>;   // one character code per cell
@group(0) @binding(2) var atlas: texture_2d<f32>;            // 16 x 6 glyphs for codes 32..127

@vertex
fn vs(@builtin(vertex_index) i: u32) -> @builtin(position) vec4<f32> {
    let p = vec2<f32>(f32((i << 1u) & 2u), f32(i & 2u));
    return vec4<f32>(p * 2.0 - 1.0, 0.0, 1.0);
}

@fragment
fn fs(@builtin(position) pos: vec4<f32>) -> @location(0) vec4<f32> {
    let local = pos.xy - params.origin;
    let size = params.cell * vec2<f32>(f32(params.cols), f32(params.rows));
    if (local.x < 0.0 || local.y < 0.0 || local.x >= size.x || local.y >= size.y) {
        discard;
    }
    let col = u32(local.x / params.cell.x);
    let row = u32(local.y / params.cell.y);
    let code = clamp(text[row * params.cols + col], 32u, 127u) - 32u;
    let inside = fract(local / params.cell);
    let g = vec2<u32>(inside * vec2<f32>(params.glyph));
    let texel = vec2<u32>((code % 16u) * params.glyph.x + g.x, (code / 16u) * params.glyph.y + g.y);
    let ink = textureLoad(atlas, texel, 0).r;
    return mix(vec4<f32>(0.0, 0.0, 0.0, 0.55), vec4<f32>(1.0, 1.0, 1.0, 1.0), ink);
}

// A stand-in for the host's renderer: three coloured discs (red, green, blue) moving
// over a dark background, so that a per-pixel colour classifier has something to find.

struct Scene {
    time: vec4<f32>,  // seconds in x
};

struct VOut {
    @builtin(position) pos: vec4<f32>,
    @location(0) uv: vec2<f32>,
};

@group(0) @binding(0) var<uniform> S: Scene;

@vertex
fn vs(@builtin(vertex_index) i: u32) -> VOut {
    let p = vec2<f32>(f32((i << 1u) & 2u), f32(i & 2u));
    var o: VOut;
    o.pos = vec4<f32>(p * 2.0 - 1.0, 0.0, 1.0);
    o.uv = vec2<f32>(p.x, 1.0 - p.y);
    return o;
}

@fragment
fn fs(v: VOut) -> @location(0) vec4<f32> {
    var colour = vec3<f32>(0.06, 0.07, 0.09) + 0.08 * v.uv.y;
    let discs = array<vec3<f32>, 3>(vec3<f32>(0.92, 0.18, 0.14), vec3<f32>(0.16, 0.84, 0.30),
                                    vec3<f32>(0.18, 0.34, 0.95));
    for (var k = 0; k < 3; k++) {
        let a = S.time.x * (0.5 + 0.25 * f32(k)) + 2.1 * f32(k);
        let centre = vec2<f32>(0.5, 0.5) + vec2<f32>(0.27 * cos(a), 0.24 * sin(1.3 * a));
        if (distance(v.uv, centre) < 0.17 - 0.02 * f32(k)) {
            colour = discs[k];
        }
    }
    return vec4<f32>(colour, 1.0);
}

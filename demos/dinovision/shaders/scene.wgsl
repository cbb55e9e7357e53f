// The DinoVision scene: textured, lit meshes (vs_object/fs_object) over a sky (vs_sky/fs_sky).
// Two colour outputs: location 0 is display-ready sRGB-encoded colour in an rgba8unorm target
// (so its bytes read like a photograph's), location 1 the object-class id in an r32uint target.
// Lighting is computed in linear light: albedo comes from an rgba8unorm-srgb texture array
// (one layer per class), a directional sun (Lambert + Blinn-Phong), hemispheric ambient, fog.

struct Frame {
    view_proj: mat4x4<f32>,
    inv_view_proj: mat4x4<f32>,
    eye: vec4<f32>,          // xyz: camera position
    sun_dir: vec4<f32>,      // xyz: unit vector towards the sun; w: unused
    sun_color: vec4<f32>,    // rgb: sun radiance; w: ambient strength
    sky_zenith: vec4<f32>,   // rgb; w: fog density (per metre)
    sky_horizon: vec4<f32>,  // rgb; w: unused
    ground_bounce: vec4<f32>,// rgb: ambient from below; w: unused
};

@group(0) @binding(0) var<uniform> frame: Frame;
@group(0) @binding(1) var albedo: texture_2d_array<f32>;
@group(0) @binding(2) var albedo_sampler: sampler;

struct ObjectIn {
    @location(0) position: vec3<f32>,
    @location(1) normal: vec3<f32>,
    @location(2) uv: vec2<f32>,
    @location(3) m0: vec4<f32>,    // model matrix columns
    @location(4) m1: vec4<f32>,
    @location(5) m2: vec4<f32>,
    @location(6) m3: vec4<f32>,
    @location(7) n0: vec3<f32>,    // normal matrix columns (inverse transpose of the 3x3 part)
    @location(8) n1: vec3<f32>,
    @location(9) n2: vec3<f32>,
    @location(10) material: vec4<f32>, // xy: uv scale; z: specular strength
    @location(11) class_id: u32,
};

struct ObjectOut {
    @builtin(position) clip: vec4<f32>,
    @location(0) world: vec3<f32>,
    @location(1) normal: vec3<f32>,
    @location(2) uv: vec2<f32>,
    @location(3) @interpolate(flat) class_id: u32,
    @location(4) @interpolate(flat) specular: f32,
};

struct Targets {
    @location(0) color: vec4<f32>,
    @location(1) class_id: u32,
};

@vertex
fn vs_object(v: ObjectIn) -> ObjectOut {
    let model = mat4x4<f32>(v.m0, v.m1, v.m2, v.m3);
    let world = model * vec4<f32>(v.position, 1.0);
    var out: ObjectOut;
    out.clip = frame.view_proj * world;
    out.world = world.xyz;
    out.normal = mat3x3<f32>(v.n0, v.n1, v.n2) * v.normal;
    out.uv = v.uv * v.material.xy;
    out.specular = v.material.z;
    out.class_id = v.class_id;
    return out;
}

fn linear_to_srgb(c: vec3<f32>) -> vec3<f32> {
    let x = clamp(c, vec3<f32>(0.0), vec3<f32>(1.0));
    let lo = x * 12.92;
    let hi = 1.055 * pow(x, vec3<f32>(1.0 / 2.4)) - 0.055;
    return select(hi, lo, x <= vec3<f32>(0.0031308));
}

fn sky_color(dir: vec3<f32>) -> vec3<f32> {
    let up = clamp(dir.y, 0.0, 1.0);
    var c = mix(frame.sky_horizon.rgb, frame.sky_zenith.rgb, sqrt(up));
    c = select(c, frame.sky_horizon.rgb * 0.9, dir.y < 0.0);
    let s = max(dot(dir, frame.sun_dir.xyz), 0.0);
    return c + frame.sun_color.rgb * (0.6 * pow(s, 400.0) + 0.08 * pow(s, 8.0));
}

@fragment
fn fs_object(f: ObjectOut) -> Targets {
    let base = textureSample(albedo, albedo_sampler, f.uv, i32(f.class_id)).rgb;
    let n = normalize(f.normal);
    let l = frame.sun_dir.xyz;
    let to_eye = frame.eye.xyz - f.world;
    let dist = length(to_eye);
    let v = to_eye / max(dist, 1e-4);
    let diffuse = max(dot(n, l), 0.0);
    let hemi = mix(frame.ground_bounce.rgb, frame.sky_zenith.rgb, 0.5 + 0.5 * n.y);
    let h = normalize(l + v);
    let spec = f.specular * pow(max(dot(n, h), 0.0), 32.0) * step(0.0, dot(n, l));
    var c = base * (frame.sun_color.w * hemi + frame.sun_color.rgb * diffuse) + spec * frame.sun_color.rgb;
    let fog = 1.0 - exp(-frame.sky_zenith.w * dist);
    c = mix(c, sky_color(-v) * 0.95, fog);
    var out: Targets;
    out.color = vec4<f32>(linear_to_srgb(c), 1.0);
    out.class_id = f.class_id;
    return out;
}

struct SkyOut {
    @builtin(position) clip: vec4<f32>,
    @location(0) ndc: vec2<f32>,
};

@vertex
fn vs_sky(@builtin(vertex_index) i: u32) -> SkyOut {
    // One triangle that covers the screen.
    let xy = vec2<f32>(f32((i << 1u) & 2u), f32(i & 2u)) * 2.0 - 1.0;
    var out: SkyOut;
    out.clip = vec4<f32>(xy, 1.0, 1.0);
    out.ndc = xy;
    return out;
}

@fragment
fn fs_sky(f: SkyOut) -> Targets {
    let near = frame.inv_view_proj * vec4<f32>(f.ndc, 0.0, 1.0);
    let far = frame.inv_view_proj * vec4<f32>(f.ndc, 1.0, 1.0);
    let dir = normalize(far.xyz / far.w - near.xyz / near.w);
    var out: Targets;
    out.color = vec4<f32>(linear_to_srgb(sky_color(dir)), 1.0);
    out.class_id = 0u;
    return out;
}

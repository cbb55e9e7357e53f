// Training labels for the decoder, on the GPU: for each cell of the label grid, the scene's
// class-ID target at the cell's centre pixel (the engine's "auto-label"), mapped to a model
// class (or "unknown": masked out), then overridden by the user's brush strokes.
struct Params {
    width: u32,       // label grid
    height: u32,
    stride: u32,      // image pixels per label cell
    offset: u32,      // first row of this eye in labels / mask
    auto_label: u32,  // 0: only brushed cells train
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var ids: texture_2d<u32>;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> class_map: array<i32>;   // engine id -> class, -1: unknown
@group(0) @binding(3) var<storage, read> brush: array<i32>;       // per cell: class, -1: none
@group(0) @binding(4) var<storage, read_write> labels: array<i32>;
@group(0) @binding(5) var<storage, read_write> mask: array<f32>;

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= params.width || gid.y >= params.height) {
        return;
    }
    let cell = gid.y * params.width + gid.x;
    let half = params.stride / 2u;
    let id = textureLoad(ids, vec2<u32>(gid.x * params.stride + half, gid.y * params.stride + half), 0).r;
    var cls = -1;
    if (params.auto_label != 0u && id < arrayLength(&class_map)) {
        cls = class_map[id];
    }
    let painted = brush[params.offset + cell];
    if (painted >= 0) {
        cls = painted;
    }
    labels[params.offset + cell] = max(cls, 0);
    mask[params.offset + cell] = select(0.0, 1.0, cls >= 0);
}

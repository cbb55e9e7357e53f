// FMA throughput through naga and the driver's compiler (bench/fma_peak.py): each thread
// runs CHAINS independent accumulators through ITERS x 8 dependent multiply-adds.
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let x = {{T}}(f32(gid.x) * 1e-9 + 0.999);
    let y = {{T}}(1e-7);
{{DECL}}
    for (var i = 0u; i < {{ITERS}}u; i = i + 1u) {
{{BODY}}
    }
    out[gid.x] = {{SUM}};
}

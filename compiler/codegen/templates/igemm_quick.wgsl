// Implicit GEMM, the quick tier's (runtime Session(quick_start=True)): a kernel the driver
// compiles in a few milliseconds, run only until the tuned one (igemm.wgsl, igemm128.wgsl)
// has compiled behind it. One output per thread of a 16 x 16 tile; each K step stages one
// element of A and one of B per thread, and the k loop stays a loop: load_a and load_b are
// written once each (the tuned kernels write them out per staged element and k, which is
// most of what their compile costs). Same contract and split-K as igemm.wgsl, every edge
// guarded (codegen/gemm.py, ALL_GUARDED, and the slice's end below); its sizes are read from a
// uniform buffer where kernels share this text (codegen/lift_sizes.py, quick_tier).
{{COMMON}}
var<workgroup> quick_a: array<array<f32, 16>, 16>;  // [row][k]
var<workgroup> quick_b: array<array<f32, 16>, 16>;  // [k][column]

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let g = wg.z / SPLIT;
    let slice = wg.z % SPLIT;
    let k_end = min(K, (slice + 1u) * KS);
    let r = wg.y * 16u + lid.y;
    let c = wg.x * 16u + lid.x;
    var acc = 0.0;
    for (var k0 = slice * KS; k0 < k_end; k0 = k0 + 16u) {
        // past the slice's end: zeros (the next slice's k belong to another partial sum)
        var a = 0.0;
        var b = 0.0;
        if (k0 + lid.x < k_end) {
            a = load_a(g, r, k0 + lid.x);
        }
        if (k0 + lid.y < k_end) {
            b = load_b(g, k0 + lid.y, c);
        }
        quick_a[lid.y][lid.x] = a;
        quick_b[lid.y][lid.x] = b;
        workgroupBarrier();
        for (var k = 0u; k < 16u; k = k + 1u) {
            acc = acc + quick_a[lid.y][k] * quick_b[k][lid.x];
        }
        workgroupBarrier();
    }
    store(g, slice, r, c, acc);
}

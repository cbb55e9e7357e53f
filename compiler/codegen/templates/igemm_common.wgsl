// The implicit-GEMM contract shared by igemm*.wgsl: sizes, split-K slices, and the
// generated load_a(g, m, k), load_b(g, k, n), store(g, slice, m, n, v) and store4 (columns n0 to
// n0 + 3 at once: what they share computed once, gemm_store.py). Edges are guarded
// here, so any M, N, K works; a dimension the tiles (or K steps) divide goes unguarded, as
// the generator knows (guarded loads cost a large GEMM several percent). Each variant adds
// its workgroup memory and main loop.
// Sizes stay written in (compiler/lift_sizes.py): the inner loops divide by them.
{{BINDINGS}}

const M: u32 = {{M}}u;
const N: u32 = {{N}}u;
const K: u32 = {{K}}u;
const SPLIT: u32 = {{SPLIT}}u;  // K is cut into SPLIT slices of KS (split-K), summed by a second kernel
const KS: u32 = {{KS}}u;

fn load_a(g: u32, m: u32, k: u32) -> f32 {
{{GUARD_A}}
{{LOAD_A}}
}

fn load_b(g: u32, k: u32, n: u32) -> f32 {
{{GUARD_B}}
{{LOAD_B}}
}

fn store(g: u32, slice: u32, m: u32, n: u32, v: f32) {
{{GUARD_STORE}}
{{STORE}}
}

fn store4(g: u32, slice: u32, m: u32, n0: u32, v4: vec4<f32>) {
{{GUARD_STORE4}}
{{STORE4}}
}

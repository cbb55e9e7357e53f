// The implicit-GEMM contract shared by igemm*.wgsl: sizes, split-K slices, and the
// generated load_a(g, m, k), load_b(g, k, n) and store(g, slice, m, n, v). Edges are guarded
// here, so any M, N, K works. Each variant adds its workgroup memory and main loop.
{{BINDINGS}}

const M: u32 = {{M}}u;
const N: u32 = {{N}}u;
const K: u32 = {{K}}u;
const SPLIT: u32 = {{SPLIT}}u;  // K is cut into SPLIT slices of KS (split-K), summed by a second kernel
const KS: u32 = {{KS}}u;

fn load_a(g: u32, m: u32, k: u32) -> f32 {
    if (m >= M || k >= K) {
        return 0.0;
    }
{{LOAD_A}}
}

fn load_b(g: u32, k: u32, n: u32) -> f32 {
    if (k >= K || n >= N) {
        return 0.0;
    }
{{LOAD_B}}
}

fn store(g: u32, slice: u32, m: u32, n: u32, v: f32) {
    if (m >= M || n >= N) {
        return;
    }
{{STORE}}
}

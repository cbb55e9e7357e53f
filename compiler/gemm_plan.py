"""How GEMM-shaped kernels are tiled, staged and stepped (codegen_gemm reads it; tests and
bench/ change it, bench/gemm_policy.py is where its numbers come from)."""

# GEMM shape plan, from bench/gemm_policy.py on the H200 (bench/results): when 64-tiles
# give fewer than `fill` workgroups, a short K (<= `short_k`) takes 32-tiles (4x the
# workgroups, each cheap), a long K keeps 64-tiles and is split into slices of at least
# `slice_min`; either is split further until about `fill` workgroups run.
GEMM_PLAN = {"fill": 256, "short_k": 512, "slice_min": 64, "slice_min_short": 128, "k_fastest_staging": True,
             # 128-tiles: K steps of 8 with the next step's loads in registers (prefetch: 4096^3 5.44 -> 4.42
             # ms with both, K steps of 16 then; since the edge checks went, 8 beat 16: 3426 -> 3370 us,
             # and NVIDIA compiles the kernel's half as long unrolled K step faster)
             "big_bk": 8, "prefetch": True,
             "vec4_loads": True, "big_bk_conv": 8, "vec4_small_tiles": True,  # convolutions' im2col loads: 284 us with 8, 307 with 16
             # 128-tiles: a thread's 4-column groups 64 apart (4096^3 3.89 -> 3.73 ms); only where M and N
             # are both >= 128 (ResNet's 64-channel 3x3 convolution with both gradients 1067 -> 814 us)
             "spread_a": False, "spread_b": True, "big_min_side": 128,
             # convolutions on 128-tiles with split-K where M and N fill them but too few tiles fill the
             # GPU, up to this many slices (0: 64-tiles then); off: see bench/REJECTED.md
             "big_split": 0,
             # 64-tiles with 8x8 outputs per thread on 8 x 8 threads (igemm128.wgsl), not 4x4 on
             # 16 x 16 (igemm.wgsl): twice the multiply-adds per workgroup-memory load; off until
             # measured on the GPU (bench/gemm_policy.py's "64-tiles 8x8 per thread" plan)
             "regs64": False,
             # 64- and 32-tiles: staging without a loop over a thread's tile entries (see _stage_small):
             # ResNet-50's 3x3 convolutions 4316 -> 4134 us, its step 32.3 -> 31.5 ms, DINOv2's 10.1 -> 9.4
             "straight_staging": True,
             # convolutions read their weight (operand A) 4 k at a time where K is a multiple of 4:
             # no faster in ResNet-50 (bench/REJECTED.md)
             "conv_vec4_weights": False,
             # 128-tiles: K steps of 8 on two tile buffers (16 KiB of workgroup memory, as one buffer
             # of 16), one barrier per step instead of two: 4096^3 3873 -> 4157 us with flat tiles, 3088 ->
             # 3231 with [buffer][k][group] ones (bench/REJECTED.md)
             "double_buffer": False,
             # threads of a warp as rows of threads (2: 16 x 2, 4: 8 x 4, see thread_xy), on 128-tiles and
             # on 64-tiles (16 x 16 threads; 8 x 8 workgroups are 8 x 4 warps either way): no faster
             # (bench/REJECTED.md)
             "warp_rows": 2, "warp_rows_small": 2,
             # operands read 4 k at a time (K-contiguous: x @ w's x, x @ w^T's w): a warp stages 32
             # rows' same 4 k (its tile stores hit 32 banks) instead of 8 rows' 16 k: slower (REJECTED.md)
             "k_rows_fastest": False,
             # workgroup tiles indexed [k][group], not k * groups + group: wgpu's bounds checks (the
             # Session's default) clamp each index, and the group's clamp is the same every K step
             # (the driver can hoist it) where the flat index's is a new one per read in the inner
             # loop; without checks the addresses are the same. H200: 4096^3 3367 -> 3087 us, the
             # policy's GEMMs and convolutions 11.6 -> 10.4 ms, ResNet-50's step 30.3 -> 27.3 ms
             "tiles_2d": True,
             # 128-tiles' rows typed [half][thread] / [thread][half] (the same bytes as [group]), so
             # that an inner-loop read's only variable index is the thread's coordinate, and an
             # operand staged 4 k at a time typed [k / 4][k % 4][...] (see _k_at): wgpu's checks
             # then clamp a few loop-invariant indices. H200, 4096^3 with the Session's checks:
             # 3,024 -> 2,989 us (rows split) -> 2,955 (and k by quads); unchecked 2,913-2,920
             # either way; the policy's GEMMs and convolutions 10.14 -> 10.00 ms (only the 4096^3
             # cases moved). With only the bounds checks 2,915, with only loop bounding 2,942.
             "split_groups": True, "split_k_quads": True,
             # K steps written out per loop trip (128-tiles; 64- and 32-tiles), where every slice's
             # steps divide by it: the driver keeps the K loop rolled, and a trip's two steps schedule
             # as one block. H200, checked: 4096^3 3093 -> 3016 us (4 steps: 3025), ResNet-50's 3x3
             # convolution 173 -> 142 us, the policy's GEMMs and convolutions 10.38 -> 10.20 ms.
             # 128-tiles whose slices span at least `long_k` take `k_unroll_long` (SmolLM2's lm head
             # 716 -> 680 us; the policy 10.21 -> 10.09 ms; 4 steps double the driver's compile time
             # of a kernel, so only where K is long)
             "k_unroll": 2, "k_unroll_small": 2, "k_unroll_long": 4, "long_k": 512,
             # results stored 4 columns at a time, what the 4 share computed once (gemm_store.py);
             # off: store4 is 4 store() calls
             "store4": True}

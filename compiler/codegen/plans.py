"""The default tile plans of the kernel generators: how GEMM-shaped kernels and attention are
tiled, split and stepped. CompileOptions copies them (options.gemm, .attention,
.attention_backward); a caller changes a plan through the options, never here. Each default is
the best measured on the GPU with bench/gemm_policy.py (bench/results); the variants that lost
are in bench/REJECTED.md."""

GEMM_PLAN = {
    # 64-tiles (4x4 outputs per thread on 16 x 16 threads) when they give at least `fill`
    # workgroups; with fewer, a K of at most `short_k` takes 32-tiles (4x the workgroups, each
    # cheap) and a longer one keeps 64-tiles, each split further (split-K, slices of at least
    # `slice_min_short` / `slice_min` k) until about `fill` workgroups run
    "fill": 256, "short_k": 512, "slice_min": 64, "slice_min_short": 128,
    # 128-tiles (8x8 outputs per thread) where they alone give 256 workgroups and M and N are
    # both at least `big_min_side`; their K step (matmuls, convolutions): with the next step's
    # loads held in registers, 8 beats 16
    "big_min_side": 128, "big_bk": 8, "big_bk_conv": 8,
    # K steps written out per loop trip (128-tiles; 64- and 32-tiles), where every split-K
    # slice's steps divide by it: the driver keeps a checked K loop rolled, and a trip's steps
    # schedule as one block. 128-tiles whose slices span at least `long_k` take `k_unroll_long`
    # (more steps double the driver's compile time of a kernel: only where K is long)
    "k_unroll": 2, "k_unroll_small": 2, "k_unroll_long": 4, "long_k": 512,
}

ATTENTION_PLAN = {
    # the forward splits its keys into ranges of at least `min_split_keys` until about `fill`
    # workgroups run, when there are at least `min_keys`; each range's partial softmax is held
    # in memory until merged (a larger fill costs a training step memory)
    "min_split_keys": 32, "fill": 512, "min_keys": 64,
}

ATTENTION_BWD_PLAN = {
    # workgroups a backward kernel aims for: with fewer, its loop (over keys for dQ, over
    # queries for dK and dV) is cut into chunks run by workgroups of their own, which write
    # partial sums that a last pass adds up (0: never); at most `max_chunks`, each of at least
    # `min_blocks` steps (block sizes: ir/ops_layers.backward_blocks)
    "fill": 1056, "max_chunks": 8, "min_blocks": 4,
    # the score tile's column loop is written out where a thread holds at most this many scores
    # of the tile (its steps over keys and queries always are): more scores a thread, and the
    # written-out column steps cost more than the loop's checks they save
    "unroll_scores": 4,
}

#!/usr/bin/env bash
# Device call (prepared, not yet run): (1) the router's many-token logits with each program taking 8 / 16 / 64 row
# blocks of experts in turn over its 8 tokens (DELTASERVE_ROUTER_ROW_BLOCKS, _gemv_blocks_kernel: x from L1 after
# the first block; the per-token launch's bits): its GPU test at the 35B router, then pp512 B=1 per block count;
# (2) the warpgroup-MMA experts kernel for a 64-stream decode (576 rows, 8-row tiles): tg128 B=64 with it from 512
# rows against the default (mma.sync below 4,096 rows), after the tiny q4 model's wgmma mode tests (8-row tiles
# now below 4,096 rows).  ~330 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_pp, bench_tg
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_kernels_gpu.py tests/gpu/test_model_mma_path.py -k "router_rows or wgmma"
for nb in 1 8 16 64; do bench_pp "router row blocks $nb" 1 DELTASERVE_ROUTER_ROW_BLOCKS=$nb; done
bench_tg "default (mma.sync below 4096 rows)" 64 64; bench_tg "wgmma from 512 rows" 64 64 DELTASERVE_MOE_WGMMA_MIN_ROWS=512
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the warpgroup-MMA experts kernel wired into the tensor-core MoE (from DELTASERVE_MOE_WGMMA_MIN_ROWS
# rows): its GPU tests (the mma.sync kernel's bits at every tile width and slot count, fp64, the block, the checks)
# and the tiny q4 model with every MoE block on it (CPU reference whole and chunked, batch invariance, graphs),
# then pp512 in the model with it against without: B=8 and B=64 (36,864 / 294,912 rows a block in one forward),
# and B=1 (4,608 rows) with the threshold lowered.  ~280 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_pp
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_wgmma_experts_gpu.py tests/gpu/test_model_mma_path.py -k "wg or wgmma"
bench_pp "wgmma (default)" 8; bench_pp "no wgmma" 8 DELTASERVE_MOE_WGMMA_MIN_ROWS=0
bench_pp "wgmma (default)" 64; bench_pp "no wgmma" 64 DELTASERVE_MOE_WGMMA_MIN_ROWS=0
bench_pp "wgmma from 4096 rows" 1 DELTASERVE_MOE_WGMMA_MIN_ROWS=4096; bench_pp "no wgmma" 1 DELTASERVE_MOE_WGMMA_MIN_ROWS=0
echo "done ($((SECONDS-t0)) s)"

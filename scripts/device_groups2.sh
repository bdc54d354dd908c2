#!/usr/bin/env bash
# Device call: the two-group steps as defaults (MoE 8-row tiles, every wg_gemv launch): (1) GPU tests: GS 2 == GS 1
# bit for bit at 64 and 512 tokens (1 passed last call), the tiny q4 model on the tensor-core paths end to end at the
# new defaults; (2) the MoE's slots at 8-row tiles with two groups a step (5@8 = 3 steps of two: 4 groups in flight;
# 3@8: 2, 7@8: 6), tg64 @ d512 at 64 streams; (3) records at this tree. The Triton cache comes back in 15 MB pieces.
# Usage (H200 machine, repo root): bash scripts/device_groups2.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg, bench_records
TESTS_NAMED=1 gpu_tests 170 tests/gpu/test_wgmma_experts_gpu.py -k "step_groups and not 1-"
TESTS_NAMED=1 gpu_tests 110 tests/gpu/test_model_mma_path.py
BENCH_TIMEOUT=120
for v in 5@8 3@8 7@8; do bench_tg "moe stages $v" 64 64 DELTASERVE_MOE_WGMMA_STAGES=$v; done
bench_records 150 110
tar czf - -C /tmp tcache | split -b 15M - "$OUT/tcache.tgz."
echo "done ($((SECONDS-t0)) s)"

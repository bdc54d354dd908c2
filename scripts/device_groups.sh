#!/usr/bin/env bash
# Device call: two groups a wgmma loop step (DELTASERVE_WGMMA_GROUPS; sm_90 SASS: the 8-row gated MoE form 166 ->
# ~145 instructions a group, the 32-row dense form 153 -> ~127, one wait / fence / barrier set per two groups).
# (1) GPU tests: GS 2 == GS 1 bit for bit (MoE and wg_gemv); (2) in-model A/B at 64 streams (tg64 @ d512) and pp512
# (1 and 64 prompts): 1, 2, 2@8 (decode-sized tiles only). Predicted: 64 streams +3-4%, pp512 +2-3%.
# Usage (H200 machine, repo root): bash scripts/device_groups.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg, bench_pp
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_wgmma_experts_gpu.py -k "step_groups"
BENCH_TIMEOUT=150
for v in 1 2 2@8 1 2; do bench_tg "groups $v" 64 64 DELTASERVE_WGMMA_GROUPS=$v; done
for v in 1 2; do for b in 1 64; do bench_pp "groups $v" $b DELTASERVE_WGMMA_GROUPS=$v; done; done
tar czf - -C /tmp tcache | split -b 40M - "$OUT/tcache.tgz."
echo "done ($((SECONDS-t0)) s)"

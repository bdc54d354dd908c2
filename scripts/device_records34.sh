#!/usr/bin/env bash
# Device call: the GPU tests the last call's window cut (the 1024-wide K split, mma_gemv through wg_gemv with the
# conv at the split's last arrival, the 168@32 cap), then the records at the wave's defaults (the experts' 168@32
# cap, the out projections on wg_gemv over eight programs). Predicted from the same-call A/Bs: 64 streams ~6,190
# (+0.9%), 8 prompts ~38,500 (+1.5%), 64 prompts ~37,500, pp512 B=1 and batch-1 decode unchanged. ~480 s.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): DELTASERVE_COMMIT=<sha> bash scripts/device_records34.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_wgmma_experts_gpu.py -k "ksplit and 1024 or through_wg_gemv or 168"
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 170 125
logs_into_one
echo "done ($((SECONDS-t0)) s)"

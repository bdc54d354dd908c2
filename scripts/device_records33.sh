#!/usr/bin/env bash
# Device call: the records at the fold and the 96@8,128@16 register caps (the new defaults), then the tensor-core
# model paths and the engine's graphs at them (window). Predictions from the same-call A/Bs: pp512 B=1 ~24,400 @ d512
# (+1.9% on 23,988), 8 prompts ~38,200 (+1%), 64 prompts ~37,400, 64 streams ~6,110, batch-1 decode unchanged.
# ~470 s.  Usage (H200 machine, repo root; carry .whl, .tcache.tgz): DELTASERVE_COMMIT=<sha> bash scripts/device_records33.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 180 130
TESTS_NAMED=1 gpu_tests 120 tests/gpu/test_model_mma_path.py tests/gpu/test_engine_graph_gpu.py
logs_into_one
echo "done ($((SECONDS-t0)) s)"

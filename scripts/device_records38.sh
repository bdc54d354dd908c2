#!/usr/bin/env bash
# Device call, wave 38's last: GPU tests of the final tree (the prefill conv's chunked == whole on both weight
# layouts, the dense matmul's bits with its (s, b) copy back, the engine's prefill graphs == eager), then the records
# at this tree. Predicted against e895148's: pp512 +0.7% at every depth and prompt count (the conv 15.4 -> 11.5 us a
# layer), decode unchanged. ~450 s with the carried cache.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): DELTASERVE_COMMIT=<sha> bash scripts/device_records38.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 170 tests/gpu/test_wgmma_dense_gpu.py tests/gpu/test_kernels_gpu.py \
  tests/gpu/test_engine_graph_gpu.py -k "dense or conv or prefill_graph"
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 165 115
logs_into_one
echo "done ($((SECONDS-t0)) s)"

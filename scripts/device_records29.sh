#!/usr/bin/env bash
# Device call: the records at this tree (the wave's defaults) after the default path's end-to-end GPU tests (the
# bf16 fast path against the CPU reference, batch invariance, graph == eager, PDL == serial; the engine's decode
# graphs == eager).  ~380 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz):
#   DELTASERVE_COMMIT=<sha> bash scripts/device_records29.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 110 tests/gpu/test_model_fast_path.py tests/gpu/test_engine_graph_gpu.py \
  -k "test_batch_invariance or test_graph_replay or test_pdl_equals or test_bf16_gpu_matches_cpu_reference or test_engine_graphs_equal_eager"
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 210 130
echo "records done ($((SECONDS-t0)) s)"
logs_into_one
echo "done ($((SECONDS-t0)) s)"

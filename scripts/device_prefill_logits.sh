#!/usr/bin/env bash
# Device call: a prefill's logits rows through the decode GEMV path (fast.logits_kernels "gemv") instead of the
# prefill matmul, which read the lm_head at ~0.5 TB/s for one row (536 us of a 512-token prefill, the profile of
# 624e514). The fast-path model's tests (CPU reference whole / chunked, batch invariance, graph == eager) and the
# engine's graphs, then pp512 gemv against matmul logits.  ~200 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_pp
TESTS_NAMED=1 gpu_tests 100 tests/gpu/test_model_fast_path.py tests/gpu/test_engine_graph_gpu.py
bench_pp "logits gemv" 1; bench_pp "logits matmul" 1 DELTASERVE_PREFILL_LOGITS=matmul
bench_pp "logits gemv" 1; bench_pp "logits matmul" 1 DELTASERVE_PREFILL_LOGITS=matmul
echo "done ($((SECONDS-t0)) s)"

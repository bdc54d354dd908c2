#!/usr/bin/env bash
# Device call: the one-row DeltaNet in-projection GEMV requesting its conv epilogue's inputs (weights, the slot's
# window, slots, context lengths) before its PDL wait (DELTASERVE_CONV_EARLY=1), with the settled decode attention
# now the default. GPU tests: the conv GEMV both ways at the 35B shape (against the GEMV then causal_conv, fp64,
# batch invariance), the bf16 fast-path model with the form on (CPU reference, batch invariance, graph == eager,
# PDL == serial), then batch 1 at d512 each way (ABBA). Prediction: the in-projection's critical time 7.62 -> ~6.9
# us (the epilogue's DRAM round trip off the path): +1.5%.  ~260 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_conv_early.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 60 tests/gpu/test_gemv_gpu.py -k "test_gemv_conv"
DELTASERVE_CONV_EARLY=1 TESTS_NAMED=1 gpu_tests 100 tests/gpu/test_model_fast_path.py \
  -k "test_bf16_gpu_matches_cpu_reference or test_batch_invariance or test_graph_replay or test_pdl_equals"
for v in 0 1 1 0; do bench_tg "conv early $v" 1 64 DELTASERVE_CONV_EARLY=$v; done
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

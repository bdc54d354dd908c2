#!/usr/bin/env bash
# Device call: the MoE decode's down launch reading the routing and requesting its experts' weights before its PDL
# wait (DELTASERVE_MOE_DOWN_EARLY=1; gate/up opens late so the routing is complete when down starts), on the
# CUDA-core MoE and the tensor-core one (DELTASERVE_MOE=mma), and the lm_head's fp32 logits store
# (DELTASERVE_LOGITS_STORE=fp32). GPU tests first (early == late bit for bit, both MoE paths; fp32 store == bf16
# widened), then tg128 @ d512: B=1 twice for each variant, B=64 for the early down.  ~500 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_gemv_gpu.py tests/gpu/test_mma_gemv_gpu.py -k "down_early or fp32_out"
for rep in 1 2; do
  bench_tg "base" 1 128 DELTASERVE_MOE_DOWN_EARLY=0
  bench_tg "down early" 1 128 DELTASERVE_MOE_DOWN_EARLY=1
  bench_tg "logits fp32" 1 128 DELTASERVE_LOGITS_STORE=fp32
done
bench_tg "mma MoE" 1 128 DELTASERVE_MOE=mma DELTASERVE_MOE_DOWN_EARLY=0
bench_tg "mma MoE, down early" 1 128 DELTASERVE_MOE=mma DELTASERVE_MOE_DOWN_EARLY=1
bench_tg "base" 64 32 DELTASERVE_MOE_DOWN_EARLY=0
bench_tg "down early" 64 32 DELTASERVE_MOE_DOWN_EARLY=1

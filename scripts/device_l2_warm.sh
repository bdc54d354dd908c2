#!/usr/bin/env bash
# Wave 42, call 3: the L2 warm in the model (DELTASERVE_L2_WARM: next = the batch-1 gate/up launch touches the next
# layer's input projection; all = and the DeltaNet step its out projection): tg64 @ d512 B=1 off / all / next
# alternating, then the GPU tests (same bits).  ~220 s
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
for mode in off all off all; do bench_tg "warm=$mode" 1 64 DELTASERVE_L2_WARM=$mode; done
TESTS_NAMED=1 gpu_tests 100 tests/gpu/test_mma_gemv_gpu.py tests/gpu/test_kernels_gpu.py \
  tests/gpu/test_model_mma_path.py -k "l2_warm and not next"

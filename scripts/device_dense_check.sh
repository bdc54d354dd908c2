#!/usr/bin/env bash
# Device call: the dense prefill route with dense_mm's TMA default: the kernel tests (the route against the wide
# kernel bit for bit over TMA and cp.async tiles, a strided x), the fast-path model with every prefill on the
# route (DELTASERVE_PREFILL_DEQUANT_MIN=1), then pp512 with 1 and 8 prompts.  ~260 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_pp
TESTS_NAMED=1 gpu_tests 120 tests/gpu/test_kernels_gpu.py -k "dense_dequant or affine"
DELTASERVE_PREFILL_DEQUANT_MIN=1 TESTS_NAMED=1 gpu_tests 110 tests/gpu/test_model_fast_path.py
bench_pp "dequant, TMA" 1; bench_pp "dequant, TMA" 8
echo "done ($((SECONDS-t0)) s)"

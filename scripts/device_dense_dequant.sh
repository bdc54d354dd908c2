#!/usr/bin/env bash
# Device call: the dense prefill projections dequantised once and multiplied by a plain tensor-core matmul
# (triton_affine.dense_path "dequant") against the wide kernel. The probe (scripts/probe_dense_prefill.py) found
# them bit-equal and ~1.5x faster at 512 rows, ~2.2x at 4096. (1) GPU tests: the route against the wide kernel bit
# for bit at the 35B-A3B's shapes and tiles, the affine kernels' tests, and the fast-path model (CPU reference,
# chunked == whole, batch invariance) with every prefill on the route (DELTASERVE_PREFILL_DEQUANT_MIN=1);
# (2) pp512 in the model, dequant against wide, 1 / 8 / 64 prompts.  ~420 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_pp
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_kernels_gpu.py -k "dense_dequant or affine"
DELTASERVE_PREFILL_DEQUANT_MIN=1 TESTS_NAMED=1 gpu_tests 120 tests/gpu/test_model_fast_path.py
for b in 1 8; do
  bench_pp "dequant" $b; bench_pp "wide" $b DELTASERVE_PREFILL_DENSE=wide
done
bench_pp "dequant again" 1
bench_pp "dequant" 64; bench_pp "wide" 64 DELTASERVE_PREFILL_DENSE=wide
echo "done ($((SECONDS-t0)) s)"

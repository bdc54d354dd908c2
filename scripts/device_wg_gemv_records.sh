#!/usr/bin/env bash
# Device call: wg_gemv as the default from 17 rows: its GPU tests (the kernel against mma_gemv, the dispatch with and
# without the conv; mma_gemv's batch invariance, launch shapes and conv, now across the two kernels; the tiny q4
# model in the mma and mma-wg-gemv modes; the engine's graphs == eager), then records at 64 and 8 streams (each its
# own deployment) and the 64-stream step profiled with distinct tokens.  ~480 s
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_wg_gemv_records.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests
TESTS_NAMED=1 gpu_tests 70 tests/gpu/test_wgmma_experts_gpu.py -k "wg_gemv"
TESTS_NAMED=1 gpu_tests 80 tests/gpu/test_mma_gemv_gpu.py -k "invariance or launch_shapes or conv"
TESTS_NAMED=1 gpu_tests 70 tests/gpu/test_model_mma_path.py -k "not moe and not head"
gpu_tests 60 tests/gpu/test_engine_graph_gpu.py
M="--preset qwen3.6-35b-a3b --quant q4"
timeout 170 python3 -m deltaserve bench $M -p 512 -n 128 -d 512 -b 64,8 -r 3 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b64.log"; grep -E "^\| deltaserve" "$OUT/bench_b64.log"
echo "== records ($((SECONDS-t0)) s)"
timeout 80 python3 -m deltaserve bench $M -p 16 -n 16 -d 512 -b 64 -r 1 --profile --no-record > "$OUT/profile64.log" 2>&1
echo "== B=64 profile ($((SECONDS-t0)) s)"; grep -A24 "decode step profile" "$OUT/profile64.log" | cut -c1-130
echo "done ($((SECONDS-t0)) s)"

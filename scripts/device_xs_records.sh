#!/usr/bin/env bash
# Device call (warm, after device_xs.sh): the staged-sums GPU test's dense half (its K = 320 case had used prep_x,
# which needs a power-of-two K: mended), the tiny q4 model with every wgmma path and both knobs, then records at this
# commit's defaults (the staged sums and carried slots on: 64 streams 5,208 -> 5,421 in device_xs.sh).  ~420 s
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_xs_records.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests
TESTS_NAMED=1 gpu_tests 80 tests/gpu/test_wgmma_experts_gpu.py -k "xs_smem and 64"
M="--preset qwen3.6-35b-a3b --quant q4"
timeout 170 python3 -m deltaserve bench $M -p 512 -n 128 -d 512 -b 64,8 -r 3 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b64.log"; grep -E "^\| deltaserve" "$OUT/bench_b64.log" | sort -u
timeout 110 python3 -m deltaserve bench $M -p 512 -n 128 -d 0,512,4096,8192,32768 -b 1 -r 5 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b1.log"; grep -E "^\| deltaserve" "$OUT/bench_b1.log" | sort -u
TESTS_NAMED=1 gpu_tests 60 tests/gpu/test_model_mma_path.py -k "wg and xs"
echo "done ($((SECONDS-t0)) s)"

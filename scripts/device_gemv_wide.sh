#!/usr/bin/env bash
# Device call: the tensor-core GEMV's register ring as its default up to 8 rows (AHEAD = chunks - 1 below 4096
# row blocks; the after-norm sweep had it faster than the CUDA-core GEMV for the 12352 x 2048 and 9216 x 2048
# projections at one row, 8.05 / 6.93 us against 10.35 / 9.68). The tensor-core model path test, then tg128 @ d512
# at B=1 for each decode GEMV mode (head, the default; wide: the weights of >= 8192 rows; mma: all), wide with the
# tensor-core MoE, and wide at 1, 8 and 64 streams.  ~250 s
# Usage (H200 machine, repo root): bash scripts/device_gemv_wide.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests 100 tests/gpu/test_model_mma_path.py
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -n 128 -r 3 --no-record -d 512"
for v in "head cuda 1" "wide cuda 1" "mma cuda 1" "wide mma 1" "head mma 1" "wide cuda 1,8,64" "head cuda 1"; do
  set -- $v
  DELTASERVE_DECODE_GEMV=$1 DELTASERVE_MOE=$2 timeout 150 python3 -m deltaserve bench $M -b $3 > "$OUT/bench.log" 2>&1
  echo "== GEMV $1 MoE $2 ($((SECONDS-t0)) s)"; grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c1-110
done

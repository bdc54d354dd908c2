#!/usr/bin/env bash
# Device call (prepared, not yet run): the tensor-core GEMV's register ring (mma_gemv AHEAD 3 .. chunks - 1:
# the first AHEAD chunks' weights requested before the PDL wait, then chunk c + AHEAD before chunk c is computed),
# the schedule that took the experts kernel's gate/up from 8.36 to 6.89 us at one token. GPU test (every AHEAD the
# same bits, plain and with the conv epilogue), the after-norm sweep at 1 and 8 rows (where the tensor-core GEMV
# lost to the CUDA-core one in the model), then the model at B=1: the lm_head (default head mode) and every decode
# linear (DELTASERVE_DECODE_GEMV=mma) with DELTASERVE_MMA_GEMV_AHEAD unset / 4 / 7.  ~450 s
# Usage (H200 machine, repo root): bash scripts/device_gemv_ring.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests 100 tests/gpu/test_mma_gemv_gpu.py -k "launch_shapes"
timeout 150 python3 scripts/sweep_mma_gemv.py --after-norm --ms 1,8 --budget-s 130 --out "$OUT/sweep_gemv.jsonl" \
  > "$OUT/sweep_gemv.log" 2>&1
echo "== after-norm sweep ($((SECONDS-t0)) s)"; grep -E "^\[" "$OUT/sweep_gemv.log" | cut -c12-140 | head -60
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -n 128 -r 3 --no-record -d 512 -b 1"
for v in "head -" "head 4" "head 7" "mma -" "mma 4" "mma 7" "head -"; do
  set -- $v
  if [ "$2" = "-" ]; then unset DELTASERVE_MMA_GEMV_AHEAD; else export DELTASERVE_MMA_GEMV_AHEAD=$2; fi
  DELTASERVE_DECODE_GEMV=$1 timeout 120 python3 -m deltaserve bench $M > "$OUT/bench.log" 2>&1
  echo "== GEMV $1 ahead $2 ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c1-110)"
done

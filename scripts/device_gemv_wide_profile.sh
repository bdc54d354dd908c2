#!/usr/bin/env bash
# Device call: why "wide" (the tensor-core GEMV for the >= 8192-row weights, register ring at one row) loses
# batch 1 in the model (597.6 tok/s against head's 610.9) when the after-norm sweep has it faster on those weights
# (12352 x 2048 8.05 us against 10.35, 9216 x 2048 6.93 against 9.68): the B=1 per-kernel decode profile of each.
# No records.  ~150 s
# Usage (H200 machine, repo root): bash scripts/device_gemv_wide_profile.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -n 32 -r 1 --no-record -d 512 -b 1 --profile"
for mode in head wide; do
  DELTASERVE_DECODE_GEMV=$mode timeout 120 python3 -m deltaserve bench $M > "$OUT/profile_$mode.log" 2>&1
  echo "== profile $mode ($((SECONDS-t0)) s)"; grep -A24 "decode step profile" "$OUT/profile_$mode.log" | cut -c1-150
done

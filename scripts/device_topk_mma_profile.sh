#!/usr/bin/env bash
# Device call: the split MoE top-k at 1 / 2 / 4 warps in the model (DELTASERVE_TOPK_WARPS; the 8 selection rounds'
# cross-warp steps are its serial chain), then where the tensor-core MoE loses batch 1: DELTASERVE_MOE=mma with the
# default "head" GEMVs at B = 1 and 64 (tg128 @ d512) and pp512, a B=1 per-kernel profile of it, and one of the
# default at 64 streams. GPU tests first: the top-k contract at each warp count. No records.  ~400 s
# Usage (H200 machine, repo root): bash scripts/device_topk_mma_profile.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
timeout 120 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_gemv_gpu.py -k "topk_contract" \
  > "$OUT/tests.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
grep -E "^FAILED|^E  " "$OUT/tests.log" | head -8
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -n 128 -r 3 --no-record"
for w in 4 2 1 4; do
  DELTASERVE_TOPK_WARPS=$w timeout 80 python3 -m deltaserve bench $M -d 512 -b 1 > "$OUT/bench_topk_w$w.log" 2>&1
  echo "== top-k $w warps ($((SECONDS-t0)) s): $(grep -E "^\| deltaserve.*tg" "$OUT/bench_topk_w$w.log" | sort -u)"
done
DELTASERVE_MOE=mma timeout 150 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 128 -r 3 \
  --no-record -d 512 -b 1,64 > "$OUT/bench_mma_moe.log" 2>&1
echo "== DELTASERVE_MOE=mma, head GEMVs ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve" "$OUT/bench_mma_moe.log" | sort -u
grep "peak GPU" "$OUT/bench_mma_moe.log"
DELTASERVE_MOE=mma timeout 80 python3 -m deltaserve bench $M -n 32 -r 1 -d 512 -b 1 --profile > "$OUT/profile_mma_b1.log" 2>&1
echo "== profile mma MoE B=1 ($((SECONDS-t0)) s)"; grep -A30 "decode step profile" "$OUT/profile_mma_b1.log" | cut -c1-120
timeout 80 python3 -m deltaserve bench $M -n 32 -r 1 -d 512 -b 64 --profile > "$OUT/profile_b64.log" 2>&1
echo "== profile default B=64 ($((SECONDS-t0)) s)"; grep -A30 "decode step profile" "$OUT/profile_b64.log" | cut -c1-120

#!/usr/bin/env bash
# Device call: the routing contract's selection by Triton's bitonic top-k (DELTASERVE_TOPK_SELECT=bitonic: the k-th
# largest key, then the keys at or above it; sm_90 at E = 256, k = 8: 712 SASS and 23 barriers against the k
# rounds' 840 and 33). GPU tests (the contract at 1 / 2 / 4 warps, the router's last arrival == the split launch,
# bitonic == rounds on fresh logits), then tg128 @ d512 B=1 alternating rounds / bitonic.  ~220 s
# Usage (H200 machine, repo root): bash scripts/device_topk_bitonic.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests 100 tests/gpu/test_gemv_gpu.py -k "topk or router_last_arrival"
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -n 128 -r 3 --no-record -d 512 -b 1"
for v in rounds bitonic rounds bitonic; do
  DELTASERVE_TOPK_SELECT=$v timeout 100 python3 -m deltaserve bench $M > "$OUT/bench.log" 2>&1
  echo "== top-k $v ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c1-110)"
done

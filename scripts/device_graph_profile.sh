#!/usr/bin/env bash
# Device call (prepared, not yet run): where the decode graph's time goes with the kernels overlapping under PDL
# (`bench --profile-graph`: each kernel's in-graph duration and critical time, bench/profile.critical_path), for
# the default "head" GEMVs and "wide" (the >= 8192-row weights on the tensor-core GEMV: 36 us a step shorter eager,
# 36 us longer in the graph, bench/NOTES.md), then the top-k at the router's last arrival against its own launch
# now that the selection is bitonic (DELTASERVE_MOE_TOPK=router vs split), and the "best" top-k (the softmax's max
# and normaliser from the k best keys: 17 barriers against bitonic's 23) against bitonic, tg128 @ d512 B=1.  ~260 s
# Usage (H200 machine, repo root): bash scripts/device_graph_profile.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests 100 tests/gpu/test_gemv_gpu.py -k "topk or router_last_arrival"
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 512 -b 1"
for mode in head wide; do
  DELTASERVE_DECODE_GEMV=$mode timeout 120 python3 -m deltaserve bench $M -n 32 --profile-graph \
    > "$OUT/graph_$mode.log" 2>&1
  echo "== graph profile $mode ($((SECONDS-t0)) s)"; grep -A30 "decode graph profile" "$OUT/graph_$mode.log" | cut -c1-140
done
for v in split router split router; do
  DELTASERVE_MOE_TOPK=$v timeout 100 python3 -m deltaserve bench $M -n 128 > "$OUT/bench.log" 2>&1
  echo "== top-k $v ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c1-110)"
done
for v in bitonic best bitonic best; do
  DELTASERVE_TOPK_SELECT=$v timeout 100 python3 -m deltaserve bench $M -n 128 > "$OUT/bench.log" 2>&1
  echo "== top-k select $v ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c1-110)"
done

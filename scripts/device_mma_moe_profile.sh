#!/usr/bin/env bash
# Device call: where the tensor-core MoE (DELTASERVE_MOE=mma, now with its early down by default) still loses to
# the CUDA-core MoE at batch 1: the replayed decode graph's critical time by kernel (`bench --profile-graph`, B=1
# @ d512) for both, then what it gives where it wins: tg32 @ d512 B=64 and pp512 B=1 for both.  ~300 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
M="--preset qwen3.6-35b-a3b --quant q4 -r 3 --no-record -d 512"
for moe in cuda mma; do
  DELTASERVE_MOE=$moe timeout 120 python3 -m deltaserve bench $M -p 16 -b 1 -n 32 --profile-graph \
    > "$OUT/graph_$moe.log" 2>&1
  echo "== graph profile MoE $moe ($((SECONDS-t0)) s)"; grep -A40 "decode graph profile" "$OUT/graph_$moe.log" | cut -c1-150
done
for moe in cuda mma; do
  DELTASERVE_MOE=$moe timeout 100 python3 -m deltaserve bench $M -p 16 -b 64 -n 32 > "$OUT/b64_$moe.log" 2>&1
  echo "== MoE $moe B=64 ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/b64_$moe.log" | sort -u | cut -c50-110)"
  DELTASERVE_MOE=$moe timeout 100 python3 -m deltaserve bench $M -p 512 -b 1 -n 16 > "$OUT/pp_$moe.log" 2>&1
  echo "== MoE $moe pp512 ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*pp' "$OUT/pp_$moe.log" | sort -u | cut -c50-110)"
done

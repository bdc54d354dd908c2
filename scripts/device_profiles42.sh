#!/usr/bin/env bash
# Wave 42: where a decode step goes at the current defaults (`bench --profile-graph`, critical time per kernel):
# 64 streams @ d512, batch 1 @ d512 and @ d32768. Logs in $OUT/graph_*.log.  ~200 s on a warm Triton cache
source "$(dirname "$0")/device_env.sh"
M="--preset qwen3.6-35b-a3b --quant q4 --no-record"
for cfg in "64 512" "1 512" "1 32768"; do
  set -- $cfg
  timeout 150 python3 -m deltaserve bench $M -p 16 -n 32 -d $2 -b $1 -r 2 --profile-graph --profile-top 30 \
    > "$OUT/graph_b$1_d$2.log" 2>&1
  echo "== graph profile B=$1 d$2 ($((SECONDS-t0)) s)"; grep -A48 "decode graph profile" "$OUT/graph_b$1_d$2.log" | cut -c1-160
done

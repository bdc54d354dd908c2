#!/usr/bin/env bash
# Device call: dense_mm with its tiles fetched by TMA (tensor descriptors) against the cp.async form, at 512 and
# 4096 rows (the dequant route's multiply is 48-51 us at 12352 x 2048 x 512 rows where cuBLAS takes 37.7, and 345
# where cuBLAS takes 267 at 4096); then the prepared graph profiles of the head and wide decode GEMV modes at batch
# 1 (scripts/device_experts_source.sh's second half).  ~150 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
timeout 150 python3 scripts/probe_dense_prefill.py --ms 512,4096 --out "$OUT/dense3.jsonl" --configs \
  "128,64,64,4,4;256,128,64,8,3;128,128,64,8,4;128,64,64,4,4,1;128,64,64,4,3,1;128,128,64,8,4,1;128,128,64,8,3,1;256,128,64,8,3,1;256,128,64,8,4,1;128,256,64,8,3,1;128,128,128,8,3,1" \
  > "$OUT/dense3.log" 2>&1
echo "== probe ($((SECONDS-t0)) s)"; grep -E "dense_mm|kernel|route|cuBLAS|ERROR" "$OUT/dense3.log" | cut -c12-120
for mode in head wide; do
  DELTASERVE_DECODE_GEMV=$mode timeout 120 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 \
    --no-record -d 512 -b 1 -n 32 --profile-graph > "$OUT/graph_$mode.log" 2>&1
  echo "== graph profile $mode ($((SECONDS-t0)) s)"; grep -A30 "decode graph profile" "$OUT/graph_$mode.log" | cut -c1-140
done

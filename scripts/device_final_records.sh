#!/usr/bin/env bash
# Device call: records at this commit's defaults only (the DeltaNet step's 64 columns in throughput deployments and
# constant stride, the sorted expert tiles, the lm_head's 64-row tiles past 32 rows); the 64- and 8-stream rows
# first, then batch 1 (its kernels are those of 15b72f3's records), each cut short by its own limit.  ~150 s warm
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_final_records.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
M="--preset qwen3.6-35b-a3b --quant q4"
timeout 120 python3 -m deltaserve bench $M -p 512 -n 128 -d 512 -b 64,8 -r 3 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b64.log"; grep -E "^\| deltaserve" "$OUT/bench_b64.log" | sort -u
timeout 90 python3 -m deltaserve bench $M -p 512 -n 128 -d 0,512,4096,8192,32768 -b 1 -r 5 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b1.log"; grep -E "^\| deltaserve" "$OUT/bench_b1.log" | sort -u
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: 32-row expert tiles from 16,384 rows (a forward of 8+ prompts of 512 tokens: 36,864 rows), against
# 16-row tiles, in the model; then the -b 64,8 records at this commit (batch 1 does not reach 16,384 rows).
# Prediction from the probe (gated + down 1,512 -> 1,325 us a layer at 4,096 tokens): 8 and 64 prompts +6%.  ~200 s
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): DELTASERVE_COMMIT=<sha> bash scripts/device_rows32.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
OFF="DELTASERVE_MOE_WGMMA_ROWS32=0"
bench_pp "16-row tiles" 8 $OFF
bench_pp "32-row tiles" 8 X=1
bench_pp "32-row tiles" 8 X=1
bench_pp "16-row tiles" 8 $OFF
bench_pp "16-row tiles" 64 $OFF
bench_pp "32-row tiles" 64 X=1
echo "== records at ${DELTASERVE_COMMIT:-?}"
m="--preset qwen3.6-35b-a3b --quant q4"
timeout 200 python3 -m deltaserve bench $m -p 512 -n 128 -d 512 -b 64,8 -r 3 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b64.log"; grep -E "^\| deltaserve" "$OUT/bench_b64.log" | sort -u
echo "done ($((SECONDS-t0)) s)"

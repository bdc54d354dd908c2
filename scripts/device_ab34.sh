#!/usr/bin/env bash
# Device call: the last wave's two measured-in-the-probe kernel options, in the model (ABAB within the call):
# the gated step's split wait (DELTASERVE_WGMMA_SPLIT_WAIT=1; probe -1% at 512 tokens, -1.7% at 4,096) at pp512 with
# 1 and 8 prompts, predicted +0.3% / +0.5%; the 32-row gated form at a 168 cap (3 programs an SM instead of 2; probe
# -5.7% at 4,096 tokens) at 8 and 64 prompts, predicted +1.5%. Then the 64-stream decode graph profile (where the
# dense projections stand). ~480 s.  Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_ab34.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
CAP=DELTASERVE_WGMMA_MAXNREG=96@8,128@16,168@32
PP_TIMEOUT=150 bench_pp "base" 1
bench_pp "split" 1 DELTASERVE_WGMMA_SPLIT_WAIT=1
bench_pp "base" 1
bench_pp "split" 1 DELTASERVE_WGMMA_SPLIT_WAIT=1
bench_pp "base" 8
bench_pp "cap168@32" 8 $CAP
bench_pp "split" 8 DELTASERVE_WGMMA_SPLIT_WAIT=1
bench_pp "base" 8
bench_pp "cap168@32" 8 $CAP
bench_pp "base" 64
bench_pp "cap168@32" 64 $CAP
timeout 120 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 -r 1 --no-record -d 512 -b 64 \
  -n 32 --profile-graph > "$OUT/graph_b64.log" 2>&1
grep -A40 'decode graph profile' "$OUT/graph_b64.log" | cut -c1-120
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

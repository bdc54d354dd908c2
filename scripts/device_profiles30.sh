#!/usr/bin/env bash
# Device call: where the two throughput targets' time goes at the current defaults, for the next wave's choice.
# The 64-stream decode graph (tg32 @ d512: each kernel's critical time per launch grid, so the fused routing's
# last arrivals, the wgmma experts and the DeltaNet step show separately) and one 512-token prefill at batch 1
# (host vs GPU time, top kernels). No code change is measured.  ~200 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_profiles30.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
m="--preset qwen3.6-35b-a3b --quant q4 --no-record"
timeout 150 python3 -m deltaserve bench $m -p 16 -r 1 -d 512 -b 64 -n 32 --profile-graph > "$OUT/graph_b64.log" 2>&1
grep -A40 'decode graph profile' "$OUT/graph_b64.log" | cut -c1-110
timeout 120 python3 -m deltaserve bench $m -p 512 -n 0 -d 0 -b 1 -r 1 --profile-prefill > "$OUT/prefill_b1.log" 2>&1
grep -v Warn "$OUT/prefill_b1.log" | tail -45 | cut -c1-130
echo "done ($((SECONDS-t0)) s)"

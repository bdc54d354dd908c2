#!/usr/bin/env bash
# Device call: batch-1 graph profiles at the wave's defaults (kernels per launch grid), at d512 and d32768, for the
# next wave's list: where the 32K gap (-15.7% in the records at f82e39d) goes.  ~90 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_profiles29.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
for d in 512 32768; do
  timeout 120 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 -r 1 --no-record -d $d -b 1 \
    -n 32 --profile-graph > "$OUT/graph_d$d.log" 2>&1
  grep -A36 'decode graph profile' "$OUT/graph_d$d.log" | cut -c1-110
done
echo "done ($((SECONDS-t0)) s)"

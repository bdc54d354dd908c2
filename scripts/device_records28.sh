#!/usr/bin/env bash
# Device call: the records at this tree (the wave's defaults: the router launch making the MoE's input norm at
# decode sizes, prefill graphs for several prompts) and the batch-1 graph profile.  ~330 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz):
#   DELTASERVE_COMMIT=<sha> bash scripts/device_records28.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 210 130
echo "records done ($((SECONDS-t0)) s)"
timeout 90 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 -n 32 -d 512 -b 1 -r 1 \
  --no-record --profile-graph > "$OUT/graph1.log" 2>&1
grep -A22 "decode graph profile" "$OUT/graph1.log" | cut -c1-120
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

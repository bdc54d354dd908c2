#!/usr/bin/env bash
# Device call: the records at this tree (the router launch that builds the expert tiles, default since this wave),
# down at 3 slots against the default 5 (7 and 9 were slower: does down want fewer?), and the batch-1 graph profile
# for the NOTES' next steps.  ~250 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz):
#   DELTASERVE_COMMIT=<sha> bash scripts/device_records_route.sh
source "$(dirname "$0")/device_env.sh"
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 170 125
echo "records done ($((SECONDS-t0)) s)"
for ns in 3@8 0 3@8; do bench_tg "down stages $ns" 64 64 DELTASERVE_MOE_WGMMA_DOWN_STAGES=$ns; done
timeout 90 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 -n 32 -d 512 -b 1 -r 1 \
  --no-record --profile-graph > "$OUT/graph1.log" 2>&1
grep -A22 "decode graph profile" "$OUT/graph1.log" | cut -c1-120
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

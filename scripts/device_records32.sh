#!/usr/bin/env bash
# Device call: the records at the wave's code (the gated launch two groups a step at every tile width, down two
# 64-row sets a program at one group a step), after the probe over the tile widths at the new defaults (8 / 16 /
# 32 rows at 512 and 4,096 tokens; which the model takes is wg_tile_rows').
# Predictions: pp512 B=1 ~24,300 @ d512 (+6%), 8 prompts ~36,000 (+5%), 64 prompts ~34,000 (+5%), 64 streams
# ~6,000 (+1.5% on the records' 5,926; the same-call A/B gave +2.8%), batch-1 decode unchanged (~675).  ~420 s
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): DELTASERVE_COMMIT=<sha> bash scripts/device_records32.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
timeout 110 python3 scripts/probe_prefill_experts.py --t 512,4096 --bn 8,16,32 --gs default --gated-ns 3 \
  --down-ns 3 --sets 2 --out "$OUT/probe-prefill-experts.jsonl" > "$OUT/probe.log" 2>&1
echo "probe rc $? ($((SECONDS-t0)) s)"; grep -E "^\|" "$OUT/probe.log" | tail -14
grep -E "Error|error" "$OUT/probe.log" | grep -v '"error": ""' | head -5
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 200 130
echo "done ($((SECONDS-t0)) s)"

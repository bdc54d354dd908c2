#!/usr/bin/env bash
# Device call: where 32-row expert tiles start to pay (the default takes them from 16,384 rows; the probe had 16
# fastest at 4,608 rows and 32 at 36,864): 1,024 and 2,048 tokens (9,216 / 18,432 rows) at 16 and 32 rows; then the
# 32-row launches' slots and groups a step at 4,096 tokens. Prediction: 32 rows ahead at 2,048 tokens (~64 rows a
# routed expert), about even at 1,024; the slots and groups within 3% of the defaults.  ~120 s
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_rows32_probe.sh
source "$(dirname "$0")/device_env.sh"
timeout 120 python3 scripts/probe_prefill_experts.py --t 1024,2048 --bn 16,32 --gs default --gated-ns 3 \
  --down-ns 3 --sets 2 --out "$OUT/probe-prefill-experts.jsonl" > "$OUT/probe.log" 2>&1
echo "probe rc $? ($((SECONDS-t0)) s)"; grep -E "^\|" "$OUT/probe.log" | tail -10
timeout 150 python3 scripts/probe_prefill_experts.py --t 4096 --bn 32 --gs 1,2 --gated-ns 3,4 --down-ns 3,5 \
  --sets 2 --out "$OUT/probe-prefill-experts.jsonl" > "$OUT/probe2.log" 2>&1
echo "probe rc $? ($((SECONDS-t0)) s)"; grep -E "^\|" "$OUT/probe2.log" | tail -10
grep -hE "Error|error" "$OUT"/probe*.log | grep -v '"error": ""' | head -5
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the tensor-core prefill router at 64 prompts (rows then mma; predicted +10%: the Gluon rows kernel's
# ~2.2 ms a layer at 32,768 tokens against ~0.3), then the records at the wave's defaults (DELTASERVE_PREFILL_ROUTER=
# mma). Predicted from the A/Bs: 8 prompts ~42,000 (+9.6% on 38,468), 64 prompts ~40,000, pp512 B=1 and every
# decode unchanged. ~430 s.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): DELTASERVE_COMMIT=<sha> bash scripts/device_records35.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
PP_TIMEOUT=150 bench_pp "rows" 64 DELTASERVE_PREFILL_ROUTER=rows
PP_TIMEOUT=150 bench_pp "mma" 64
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 170 125
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the records at the wave's final code (the prefill's in-place column views; decode kernels as at
# f82e39d). Prediction: decode unchanged within noise (B=1 @ d512 ~673), pp512 B=1 ~+0.4%, 8 prompts ~+1%.  ~340 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz):
#   DELTASERVE_COMMIT=<sha> bash scripts/device_records30.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 200 130
echo "done ($((SECONDS-t0)) s)"

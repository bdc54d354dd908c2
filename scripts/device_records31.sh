#!/usr/bin/env bash
# Device call: the records at the wave's final code (the Gluon router rows and the parallel expert tiles at
# prefill; decode kernels as at 67ccfc9). Prediction: decode unchanged within noise (B=1 @ d512 ~676, 64 streams
# ~5,900), pp512 B=1 +7% (d512 ~22,300), 8 prompts +7% (~33,200), 64 prompts +8% (~32,000).  ~340 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz):
#   DELTASERVE_COMMIT=<sha> bash scripts/device_records30.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 200 130
echo "done ($((SECONDS-t0)) s)"

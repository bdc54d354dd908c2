#!/usr/bin/env bash
# Device call: the records at this tree (the wave's defaults: the settled decode attention, the conv GEMV's early
# inputs). The default path's GPU tests ran in the calls that timed them (scripts/device_kv_early.sh,
# scripts/device_conv_early.sh).  ~340 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz):
#   DELTASERVE_COMMIT=<sha> bash scripts/device_records29.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 200 130
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the records at this tree (the 64-stream merge default of 0c68148 had none), then the prepared ncu of
# the 64-stream MoE at one and two groups a step (scripts/device_experts_ncu_gs.sh), then the cache entries this
# call compiled (cache_news).  ~520 s
# Usage (H200 machine, repo root; carry .whl and .tcache.txz): DELTASERVE_COMMIT=<sha> bash scripts/device_records_ncu.sh
source "$(dirname "$0")/device_env.sh"
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 170 125
echo "records done ($((SECONDS-t0)) s)"
bash "$(dirname "$0")/device_experts_ncu_gs.sh" | tail -60
cache_news
echo "done ($((SECONDS-t0)) s)"

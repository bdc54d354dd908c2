#!/usr/bin/env bash
# Device call: records at this commit's defaults only (the DeltaNet step's 64 columns in throughput deployments and
# constant stride, the sorted expert tiles, the lm_head's 64-row tiles past 32 rows); the 64- and 8-stream rows
# first, then batch 1 (its kernels are those of 15b72f3's records), each cut short by its own limit.  ~150 s warm
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_final_records.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, bench_records
bench_records 120 90
echo "done ($((SECONDS-t0)) s)"

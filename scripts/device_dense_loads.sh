#!/usr/bin/env bash
# Device call: dense_mm's tile loads in the model, TMA against cp.async (DELTASERVE_DENSE_LOADS), pp512 with 1 and 8
# prompts, alternating; the probe gave TMA -13% at 512 rows and -17% at 4096 per multiply.  ~110 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, bench_pp
for round in 1 2; do
  bench_pp "tma" 1; bench_pp "cp.async" 1 DELTASERVE_DENSE_LOADS=cp.async
done
bench_pp "tma" 8; bench_pp "cp.async" 8 DELTASERVE_DENSE_LOADS=cp.async
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the throughput deployments' merge at 16 x 256 (the sweep's best at 64 streams, d512 and d4096; not yet
# in the model; its kernel tests passed in the call before): tg64 @ d512 at 64 streams, 16 x 256 (the default),
# 16 x 64, 128 x 32. Predicted: 16 x 256 ~+0.3% over 16 x 64. Usage (H200 machine, repo root): bash scripts/device_merge2.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, bench_tg
BENCH_TIMEOUT=90
for v in auto 16x64 128x32 auto; do bench_tg "merge $v" 64 64 DELTASERVE_ATTN_MERGE=$v; done
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: L2 prefetches on a side stream (model/prefetch.py, DELTASERVE_L2_PREFETCH). First the GPU tests
# (the kernels run; decode logits with every prefetch on == off, eager and graph, in the default "head" mode and
# the tensor-core MoE mode), then tg128 @ d512 B=1 for each prefetch set, a base before and after.  ~330 s
# Usage (H200 machine, repo root): bash scripts/device_l2_prefetch.sh [SETS...]
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests ${TEST_WINDOW:-110} tests/gpu/test_l2_prefetch_gpu.py -k "kernels_run or head or mma-moe"
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 512 -b ${BATCH:-1}"
SETS=${*:-0 1 mixer,next next down mixer,next,down,gateup 0 1}
for v in $SETS; do
  DELTASERVE_L2_PREFETCH=$v timeout 100 python3 -m deltaserve bench $M -n 128 > "$OUT/bench_$v.log" 2>&1
  echo "== prefetch $v ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench_$v.log" | sort -u | cut -c1-110)"
  grep -E "Error|error" "$OUT/bench_$v.log" | head -3
done

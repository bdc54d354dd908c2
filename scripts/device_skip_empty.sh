#!/usr/bin/env bash
# Device call: the experts kernels' programs on the tile table's unused tail tiles returning at once (mma.sync:
# DELTASERVE_MMA_SKIP_EMPTY, default on; the warpgroup-MMA kernel: always). GPU tests of both kernels (the bits),
# the probe at 512 / 4096 tokens (mma.sync with and without the skip, wgmma 8- and 16-row tiles), then pp512 B=1
# in the model: default, without the skip, and on the wgmma kernel from 4,096 rows.  ~270 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_pp
gpu_tests 130 tests/gpu/test_wgmma_experts_gpu.py tests/gpu/test_mma_gemv_gpu.py -k "experts or moe_block"
timeout 100 python3 scripts/probe_wgmma_experts.py --t 512,4096 --bn 8,16 --ns 3 --out "$OUT/probe.jsonl" \
  > "$OUT/probe.log" 2>&1
echo "== probe ($((SECONDS-t0)) s)"; grep -E "differing|Error|error" "$OUT/probe.log" | cut -c1-160; grep -E "^\|" "$OUT/probe.log"
bench_pp "default (skip)" 1; bench_pp "no skip" 1 DELTASERVE_MMA_SKIP_EMPTY=0
bench_pp "wgmma from 4096 rows" 1 DELTASERVE_MOE_WGMMA_MIN_ROWS=4096; bench_pp "default (skip)" 8
echo "done ($((SECONDS-t0)) s)"

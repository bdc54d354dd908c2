#!/usr/bin/env bash
# Device call: the rank kernel's share of the tile table spread by tile (tile j of expert e by program (e + j) mod
# programs: pp512's shared expert has 32 tiles, which one program wrote in a loop of 32; the eager profile had the
# rank kernel at 14.1 us a layer) and the Gluon router rows at 8 rows x 16 tokens a program (the probe: 37.0 us at
# 512 tokens against 42.3 for 4 x 16, 270 against 311 at 4,096). GPU tests: the expert tiles (with a heavy shared
# expert) and router rows bit for bit; the probe; pp512 B=1 ABBA the first call's defaults against these, and 4 x 16
# once. Predictions: rank 14 -> ~8 us, tiles 18.5 -> ~12 us (graph); pp512 B=1 +1% (0.8% router, ~1% tiles).  ~250 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_tiles_rows31.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 130 tests/gpu/test_kernels_gpu.py -k "test_moe_router_rows or test_expert_tiles"
timeout 90 python3 scripts/probe_router_rows.py --t 512,4096 --shapes 4,16 8,16 \
  --out "$OUT/probe-router-rows.jsonl" > "$OUT/probe.log" 2>&1; echo "probe rc $?"; tail -8 "$OUT/probe.log"
bench_pp "rows 8,16" 1
bench_pp "rows 4,16" 1 DELTASERVE_ROUTER_ROWS_SHAPE=4,16
bench_pp "rows 4,16" 1 DELTASERVE_ROUTER_ROWS_SHAPE=4,16
bench_pp "rows 8,16" 1
bench_pp "serial tiles, rows 8,16" 1 DELTASERVE_MOE_TILES_SCAN=serial
logs_into_one
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the prefill's router logits from the Gluon rows kernel (moe/gluon_router_rows: the per-token
# router's bits with x read straight into the weight tile's layout, no per-token layout moves; the Triton rows GEMV
# had 111 block barriers a program) and the expert tiles from the parallel scan (per-block histograms, a scan per
# expert column, pairwise ranks; the serial scan was one program). GPU tests: router rows bit for bit against the
# per-token launch (Triton rows and six Gluon program shapes, T = 1 / 64 / 512 / 515), the expert tiles against
# the torch reference in both scan modes (up to 36,864 rows); the probe (timings of each variant at 512 and 4,096
# tokens, each checked first); then pp512 B=1 ABBA old/new, each change alone, and 8 prompts old/new.
# Predictions: router rows 66 -> ~35 us a layer at 512 tokens, tiles ~22 -> ~8 us a layer; pp512 B=1 24.6 ms ->
# ~22.7 ms (+8%: router +5%, tiles +3%); 8 prompts ~+6%.  ~560 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_router_tiles31.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_kernels_gpu.py -k "test_moe_router_rows or test_expert_tiles"
timeout 120 python3 scripts/probe_router_rows.py --t 512,4096 --shapes 4,16 8,16 8,8 4,8 16,4 \
  --out "$OUT/probe-router-rows.jsonl" > "$OUT/probe.log" 2>&1; echo "probe rc $?"; tail -16 "$OUT/probe.log"
OLD="DELTASERVE_ROUTER_ROWS_KERNEL=triton DELTASERVE_MOE_TILES_SCAN=serial"
NEW="DELTASERVE_ROUTER_ROWS_KERNEL=gluon DELTASERVE_MOE_TILES_SCAN=parallel"
bench_pp "old" 1 $OLD
bench_pp "new" 1 $NEW
bench_pp "new" 1 $NEW
bench_pp "old" 1 $OLD
bench_pp "router only" 1 DELTASERVE_ROUTER_ROWS_KERNEL=gluon DELTASERVE_MOE_TILES_SCAN=serial
bench_pp "tiles only" 1 DELTASERVE_ROUTER_ROWS_KERNEL=triton DELTASERVE_MOE_TILES_SCAN=parallel
bench_pp "old" 8 $OLD
bench_pp "new" 8 $NEW
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

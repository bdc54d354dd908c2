#!/usr/bin/env bash
# Device call: the decode attention merge's launch shape (BSP splits a step x BD columns a program; a row's
# summation order, so one per deployment: triton_paged.merge_shape, DELTASERVE_ATTN_MERGE). At 64 streams @ d512 the
# merge is 10 x 22.5 us a step (8,192 programs each reducing a [128, 32] tile for 9 live splits). Predicted: a
# 16-split step over 64-128 columns ~8 us a layer, 64 streams +1-1.5%. (1) the GPU attention kernel test (merge
# shapes against fp64, a row alone == in the batch); (2) the sweep at 64 streams, d512 and d4096; (3) in-model A/B.
# Usage (H200 machine, repo root): bash scripts/device_merge.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg
TESTS_NAMED=1 gpu_tests 90 tests/gpu -k "paged_attention and not fp8"
timeout 150 python3 scripts/sweep_decode_attention.py --bs 64 --depths 512,4096 --budget-s 120 --out "$OUT/sweep.jsonl" \
  --shapes "64,64,lib,lib,128,32;64,64,lib,lib,16,32;64,64,lib,lib,16,64;64,64,lib,lib,16,128;64,64,lib,lib,16,256;64,64,lib,lib,32,64;64,64,lib,lib,8,64" \
  > "$OUT/sweep.log" 2>&1; echo "== sweep ($((SECONDS-t0)) s)"; grep -vE '^\s*$' "$OUT/sweep.log" | tail -16 | cut -c1-150
BENCH_TIMEOUT=100
for v in auto 16x64 16x128 auto 16x64; do bench_tg "merge $v" 64 64 DELTASERVE_ATTN_MERGE=$v; done
for v in auto 16x64; do bench_tg "merge $v" 8 64 DELTASERVE_ATTN_MERGE=$v; done
echo "done ($((SECONDS-t0)) s)"

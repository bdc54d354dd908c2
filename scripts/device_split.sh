#!/usr/bin/env bash
# Device call: the K = 4096 out projections at 64 rows (mma_gemv, 8 warps a program, 255 registers: one program an
# SM, 20.8 us) with the rows of x split over programs (DELTASERVE_MMA_GEMV_SPLIT_ROWS 16 / 32, a register cap of 128
# at 32): the GPU test (bits against the unsplit launch), the probe, tg64 @ d512 at 64 streams per variant.  ~170 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg
TESTS_NAMED=1 gpu_tests 60 tests/gpu/test_mma_gemv_gpu.py -k "row_split"
timeout 60 python3 scripts/probe_wg_gemv.py --shapes "" --split --out "$OUT/probe.jsonl" > "$OUT/probe.log" 2>&1
echo "== probe ($((SECONDS-t0)) s)"; grep -E "DIFFER|differ|Error|error" "$OUT/probe.log" | cut -c1-160
grep -E "^\|" "$OUT/probe.log"
bench_tg "no split" 64 64 DELTASERVE_MMA_GEMV_SPLIT_ROWS=0
bench_tg "split 16" 64 64 DELTASERVE_MMA_GEMV_SPLIT_ROWS=16
bench_tg "split 32 cap 128" 64 64 DELTASERVE_MMA_GEMV_SPLIT_ROWS=32 DELTASERVE_MMA_GEMV_SPLIT_MAXNREG=128
tar czf "$OUT/tcache.tgz" -C /tmp tcache && split -b 15M "$OUT/tcache.tgz" "$OUT/tcache.tgz." && rm "$OUT/tcache.tgz"
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the K = 4096 out projections on wg_gemv below 17 rows (DELTASERVE_MMA_GEMV_WG_ROWS_K4096): the probe at
# 8 and 16 rows (8- and 16-row tiles, the K split over 2 / 4 / 8 programs, each form bit-checked against mma_gemv),
# then an 8-stream decode (tg64 @ d512) ABAB with them from 17 rows (the default) and from 1. At 32 rows the split
# over eight took the mma.sync GEMV's 11.3 us to 7.8: predicted at 8 rows ~8.5 -> ~6 us, 40 a step: 8 streams +2%.
# ~300 s.  Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_k4096_rows.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
for mb in 8:8 16:16; do
  timeout 70 python3 scripts/probe_wg_gemv.py --shapes 3 --ms ${mb%:*} --bn ${mb#*:} --ns 3 --xs smem --ks 2,4,8 \
    --out "$OUT/probe_k4096.jsonl" > "$OUT/probe_${mb%:*}.log" 2>&1
  echo "probe m=${mb%:*} rc $? ($((SECONDS-t0)) s)"; grep -E "^\||differ|DIFFER" "$OUT/probe_${mb%:*}.log" | grep -v "^| shape\|^|---"
done
for i in 1 2; do
  BENCH_TIMEOUT=100 bench_tg "out on mma.sync below 17 rows" 8 64 DELTASERVE_MMA_GEMV_WG_ROWS_K4096=17
  bench_tg "out on wg_gemv from 1 row" 8 64 DELTASERVE_MMA_GEMV_WG_ROWS_K4096=1
done
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the records' 64-prompt pp512 @ d512 (36,360, against 37,514 last wave and the cap A/B's -0.3% at d0)
# ABAB with and without the experts' 168@32 cap, and the 64-stream decode ABAB with the out projections on mma.sync
# (KSPLIT 1,0) and on wg_gemv over eight programs (the default), whose record (6,140) showed none of the A/B's
# +0.9%. ~250 s.  Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_check34.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
pp64() {
  env "${@:2}" timeout 120 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 512 -b 64 \
    -r 3 --no-record > "$OUT/pp.log" 2>&1
  echo "== $1 ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*pp' "$OUT/pp.log" | sort -u | cut -c50-110)"
}
for i in 1 2; do
  pp64 "64 prompts, cap 168@32" DELTASERVE_WGMMA_MAXNREG=96@8,128@16,168@32
  pp64 "64 prompts, no 32-row cap" DELTASERVE_WGMMA_MAXNREG=96@8,128@16
done
for i in 1 2; do
  BENCH_TIMEOUT=120 bench_tg "out on mma.sync (1,0)" 64 64 DELTASERVE_WG_GEMV_KSPLIT=1,0
  bench_tg "out on wg_gemv x8 (1,8)" 64 64 DELTASERVE_WG_GEMV_KSPLIT=1,8
done
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

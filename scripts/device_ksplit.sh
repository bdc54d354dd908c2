#!/usr/bin/env bash
# Device call: wg_gemv with a row block's K split over programs (wg_gemv(ksplit=), DELTASERVE_WG_GEMV_KSPLIT=A,B:
# A for the 4-warp K split of the in_proj / q|k|v, B for the 8-warp one of the K = 4096 out projections, which now
# leave mma.sync's row split for wg_gemv; 0: they stay). At 64 streams (graph profile, this wave's first call) the
# in_proj took 30.1 us of critical time a layer (386 programs), the out projections on mma.sync 16.7 (256 programs,
# x re-read by each 16 weight rows): predicted out projections -> ~8 us (4 splits: 256 programs, x read per 64 rows),
# in_proj -> ~20 (2 splits), 64 streams +3% (out) / +3% (in_proj). First the GPU tests (the splits == mma_gemv, the
# dispatch with the conv at the last arrival, the 168@32 cap), then the probe, then tg64 @ d512 ABA. ~560 s.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_ksplit.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 170 tests/gpu/test_wgmma_experts_gpu.py -k "ksplit or through_wg_gemv or 168"
for mb in 64:32 32:16; do
  timeout 110 python3 scripts/probe_wg_gemv.py --shapes 0,1,3 --ms ${mb%:*} --bn ${mb#*:} --ns 3 --xs smem \
    --ks 1,2,4,8 --out "$OUT/probe_ks.jsonl" > "$OUT/probe_${mb%:*}.log" 2>&1
  echo "probe m=${mb%:*} rc $? ($((SECONDS-t0)) s)"; grep -E "^\||differ|DIFFER" "$OUT/probe_${mb%:*}.log" | grep -v "^| shape\|^|---"
done
BENCH_TIMEOUT=150 bench_tg "base 1,0" 64 64 DELTASERVE_WG_GEMV_KSPLIT=1,0
bench_tg "out 4 (1,4)" 64 64 DELTASERVE_WG_GEMV_KSPLIT=1,4
bench_tg "in 2, out 4 (2,4)" 64 64 DELTASERVE_WG_GEMV_KSPLIT=2,4
bench_tg "out 8 (1,8)" 64 64 DELTASERVE_WG_GEMV_KSPLIT=1,8
bench_tg "base 1,0" 64 64 DELTASERVE_WG_GEMV_KSPLIT=1,0
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

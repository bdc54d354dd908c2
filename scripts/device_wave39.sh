#!/usr/bin/env bash
# Device call (wave 39, no code change): two launch shapes that existing knobs reach and no call has timed in the
# model. (1) 64 streams: the in-projection (12352 x 2048) and q|k|v at 64-row wg_gemv tiles with K over 4 / 2
# programs (DELTASERVE_MMA_GEMV_WG_BN=64, DELTASERVE_WG_GEMV_KSPLIT=A,8): each weight dequantised once per 64 rows
# instead of twice, 772 programs instead of 386; predicted in_proj 30 -> ~18 us a layer, 64 streams +3%. The kernel
# probe first (bits against mma_gemv, then graph-timed). (2) batch 1 at 32K: the decode merge's launch shape
# (DELTASERVE_ATTN_MERGE; the batch-1 default 128x32 is 128 programs taking 512 splits in 4 steps): 256x16 and
# 128x16 (256 programs), predicted merge 8.3 -> ~4 us a layer, d32768 +2.5%. ~540 s with a cold Triton cache.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_wave39.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
timeout 100 python3 scripts/probe_wg_gemv.py --ms 64 --bn 32,64 --ns 3 --xs smem --ks 1,2,4 --shapes 0,1 \
  --out "$OUT/probe_wg_gemv.jsonl" > "$OUT/probe_wg_gemv.log" 2>&1
grep -E "DIFFER|rror|us" "$OUT/probe_wg_gemv.log" | tail -14 | cut -c1-120
BENCH_TIMEOUT=200 bench_tg "64s base (cold)" 64 64
bench_tg "64s BN64 KS4" 64 64 DELTASERVE_MMA_GEMV_WG_BN=64 DELTASERVE_WG_GEMV_KSPLIT=4,8
bench_tg "64s BN64 KS2" 64 64 DELTASERVE_MMA_GEMV_WG_BN=64 DELTASERVE_WG_GEMV_KSPLIT=2,8
bench_tg "64s base" 64 64
BENCH_ARGS="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 32768"
BENCH_TIMEOUT=160 bench_tg "32K merge 128x32 (cold)" 1 64
bench_tg "32K merge 256x16" 1 64 DELTASERVE_ATTN_MERGE=256x16
bench_tg "32K merge 128x16" 1 64 DELTASERVE_ATTN_MERGE=128x16
cache_news
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the tensor-core experts kernel's sorted tiles of 8 / 16 / 32 rows at prefill sizes. ncu at T = 512
# (2026-12-01): the gated gate/up 265 us, ~2 instructions a cycle per SM of 4 with 5 programs an SM, 37% of its
# instructions the dequant, which a tile of 16 columns spends once for twice the tokens (sm_90: 1,704 SASS against
# 1,248 for 8, 108 registers against 87). (1) scripts/sweep_mma_gemv.py --experts at T = 512 and 4096 over tile rows
# x AHEAD x LOOP (each checked bit for bit against the first configuration and against fp64); (2) pp512 in the model
# with DELTASERVE_MMA_TILE_ROWS = 8 / 16 / 32 (B=1, and B=8).  ~420 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, bench_pp
timeout 300 python3 scripts/sweep_mma_gemv.py --experts --ms 512,4096 --tile-rows 8,16,32 --aheads 1,2 --loops 2 \
  --own-xs loaded --budget-s 240 > "$OUT/sweep.log" 2>&1
echo "== sweep ($((SECONDS-t0)) s)"; grep -vE "^\s*$" "$OUT/sweep.log" | tail -45 | cut -c1-160
for rows in 8 16 32; do bench_pp "rows $rows" 1 DELTASERVE_MMA_TILE_ROWS=$rows; done
for rows in 8 32; do bench_pp "rows $rows" 8 DELTASERVE_MMA_TILE_ROWS=$rows; done
bench_pp "rows 16 again" 1 DELTASERVE_MMA_TILE_ROWS=16
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Wave 46, call 3: tg64 @ d512 at 64 streams with the MoE's tile sets (default from 48 tokens) and joint, three
# times each, alternating; then at 32, 16, 8 streams and batch 1 the warpgroup-MMA experts kernel from that batch's
# rows (DELTASERVE_MOE_WGMMA_MIN_ROWS) joint and as two tile sets against today's mma.sync default (call 2 found
# 32 streams 3,636 on mma.sync, 3,885 on it joint, 3,972 as sets).
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_moe_rows.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
export BENCH_TIMEOUT=150
for i in 1 2 3; do
  bench_tg "sets" 64 64
  bench_tg "joint" 64 64 DELTASERVE_MOE_HALVES=0
done
for b in 32 16 8; do
  m=$((b * 9))
  bench_tg "default (mma.sync)" $b 64
  bench_tg "wg joint" $b 64 DELTASERVE_MOE_WGMMA_MIN_ROWS=$m DELTASERVE_MOE_HALVES=0
  bench_tg "wg sets" $b 64 DELTASERVE_MOE_WGMMA_MIN_ROWS=$m DELTASERVE_MOE_HALVES=$b
done
bench_tg "default (mma.sync)" 1 64
bench_tg "wg" 1 64 DELTASERVE_MOE_WGMMA_MIN_ROWS=9
grep -E "Error|error" "$OUT/bench.log" | tail -3
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: where the time goes now, for the next wave's choices: (1) a 64-stream decode step (eager, by kernel
# class; the mma deployment), (2) the batch-1 decode graph's critical path by kernel, (3) one pp512 prefill by block
# and kernel; then (4) an 8-stream A/B of the wgmma experts kernel from 64 rows (72 rows at B=8) against the default
# mma.sync there. The Triton cache back in two parts ($OUT/tcache.tgz.0, .1: one file may hold 16 MB).  ~320 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
M="--preset qwen3.6-35b-a3b --quant q4 --no-record"
timeout 120 python3 -m deltaserve bench $M -p 16 -n 16 -d 512 -b 64 -r 1 --profile > "$OUT/profile64.log" 2>&1
echo "== B=64 profile ($((SECONDS-t0)) s)"; grep -A28 "decode step profile" "$OUT/profile64.log" | cut -c1-130
timeout 120 python3 -m deltaserve bench $M -p 16 -n 16 -d 512 -b 1 -r 1 --profile-graph > "$OUT/graph1.log" 2>&1
echo "== B=1 graph profile ($((SECONDS-t0)) s)"; grep -A40 -i "graph" "$OUT/graph1.log" | grep -v '^| ' | head -45 | cut -c1-130
timeout 120 python3 -m deltaserve bench $M -p 512 -n 0 -d 0 -b 1 -r 1 --profile-prefill > "$OUT/prefill.log" 2>&1
echo "== pp512 profile ($((SECONDS-t0)) s)"; grep -A36 "prefill profile" "$OUT/prefill.log" | cut -c1-130
bench_tg "default (mma.sync at 72 rows)" 8 64
bench_tg "wgmma from 64 rows" 8 64 DELTASERVE_MOE_WGMMA_MIN_ROWS=64
tar czf /tmp/tc.tgz -C /tmp tcache && split -b 15M -d -a 1 /tmp/tc.tgz "$OUT/tcache.tgz."
echo "done ($((SECONDS-t0)) s)"

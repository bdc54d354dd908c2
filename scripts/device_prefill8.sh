#!/usr/bin/env bash
# Device call (prepared, not yet run): (1) the 8-prompt pp512's spread (29,804 +-108, 26,086 +-501, 25,938 +-522 on
# one set of prefill kernels in three record runs): pp512 @ d0 at 8 prompts three times and at 1 and 64 once, then
# `bench --profile-prefill` at 8 prompts (it profiles the -b prompts since c5fd56d) and at 1; (2) where a 64-stream
# step goes at the new defaults (the DeltaNet step on 64 columns: ~78 us a layer predicted from the sweep), the
# graph profile at tg32 @ d512.  ~330 s from a warm cache
# Usage (H200 machine, repo root): bash scripts/device_prefill8.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, bench_pp
for b in 8 8 1 64 8; do bench_pp default $b; done
M="--preset qwen3.6-35b-a3b --quant q4 --no-record"
for b in 8 1; do
  timeout 120 python3 -m deltaserve bench $M -p 512 -n 0 -d 0 -b $b -r 2 --profile-prefill > "$OUT/pp_prof$b.log" 2>&1
  echo "== prefill profile B=$b ($((SECONDS-t0)) s)"; grep -A30 "# prefill profile" "$OUT/pp_prof$b.log" | cut -c1-150
done
timeout 120 python3 -m deltaserve bench $M -p 16 -n 32 -d 512 -b 64 -r 2 --profile-graph > "$OUT/graph64.log" 2>&1
echo "== graph profile B=64 ($((SECONDS-t0)) s)"; grep -A25 "decode graph profile" "$OUT/graph64.log" | cut -c1-150
echo "done ($((SECONDS-t0)) s)"

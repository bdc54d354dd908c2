#!/usr/bin/env bash
# Device call: the 8-prompt pp512's spread (29,804 +-108, 26,086 +-501, 25,938 +-522, 29,970 +-91, 30,017 +-629 and
# 24,442 +-1,393 on one set of prefill kernels in six record runs): pp512 @ d0 at 8 prompts three times and at 1 and
# 64 once, then `bench --profile-prefill` (host against GPU time) at 8 prompts and at 1, with the GPU's clocks before
# and after. Prediction: the 8-prompt forward (eager, 4,096 tokens) is partly host-bound, so its spread follows the
# host's time, not the kernels'.  ~260 s from a warm cache
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_prefill8.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, bench_pp
nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu --format=csv
for b in 8 8 1 64 8; do bench_pp default $b; done
M="--preset qwen3.6-35b-a3b --quant q4 --no-record"
for b in 8 1; do
  timeout 120 python3 -m deltaserve bench $M -p 512 -n 0 -d 0 -b $b -r 2 --profile-prefill > "$OUT/pp_prof$b.log" 2>&1
  echo "== prefill profile B=$b ($((SECONDS-t0)) s)"; grep -A30 "# prefill profile" "$OUT/pp_prof$b.log" | cut -c1-150
done
nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu --format=csv
rm -f "$OUT/pp.log"
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# (Ran in wave 43 on an H100 at 3aaca3f / 6a9d7da: the L2 warm lost in every form and was removed after it, so this
# script no longer runs on main; bench/NOTES.md wave 43 has its numbers.)
# Why the L2 warm lost (H100, wave 43: off 629.6 / 630.6, next 605.6 / 606.6, all 601.9 / 600.6 tok/s @ d512):
# the graph profiles of a batch-1 step @ d512, off and next (which kernels' critical time grew), and the DeltaNet
# step's form alone ("step") against off.  ~200 s on a warm Triton cache
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
for mode in off next; do
  DELTASERVE_L2_WARM=$mode timeout 100 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 --no-record \
    -p 16 -n 32 -d 512 -b 1 -r 2 --profile-graph --profile-top 12 > "$OUT/graph_$mode.log" 2>&1
  echo "== graph profile $mode ($((SECONDS-t0)) s)"; grep -A22 "decode graph profile" "$OUT/graph_$mode.log" | cut -c1-120
done
for mode in off step off step; do bench_tg "warm=$mode d512" 1 64 DELTASERVE_L2_WARM=$mode; done
echo "done ($((SECONDS-t0)) s)"

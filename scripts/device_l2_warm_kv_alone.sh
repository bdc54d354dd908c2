#!/usr/bin/env bash
# (Ran in wave 43 on an H100 at 3aaca3f / 6a9d7da: the L2 warm lost in every form and was removed after it, so this
# script no longer runs on main; bench/NOTES.md wave 43 has its numbers.)
# The K/V touches alone (DELTASERVE_L2_WARM=off, DELTASERVE_L2_WARM_KV=MB): wave 43's first call timed them only under
# "all", which itself lost 4.6% @ d512 on the H100. tg64 B=1 @ d32768 with 0 / 16 / 32 MB, twice; ~200 s
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
for kv in 0 16 32 0 16 32; do
  BENCH_ARGS="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 32768" BENCH_TIMEOUT=100 \
    bench_tg "kv=$kv d32768" 1 64 DELTASERVE_L2_WARM=off DELTASERVE_L2_WARM_KV=$kv
done
echo "done ($((SECONDS-t0)) s)"

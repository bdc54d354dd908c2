#!/usr/bin/env bash
# Device call (prepared, not yet run): prefill router programs of several tokens (DELTASERVE_ROUTER_TOKENS; at pp512
# the router was 40 x 78 us of one prefill: 33,280 programs each fetching 8 KB of weights and a 4 KB x row from L2
# for 4 logits). GPU test: 2 .. 64 tokens a program == one, bit for bit, logits and routing. Then pp512 B=1 (the
# prefill graph) with 1, 8, 16, 64 tokens a program, default and tensor-core MoE, and tg128 B=64 (T = 64 reaches
# the threshold) with 1 and 8.  ~300 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests 90 tests/gpu/test_gemv_gpu.py -k "router_token_blocks or router_last_arrival"
M="--preset qwen3.6-35b-a3b --quant q4 -r 3 --no-record -d 512"
for moe in cuda mma; do
  for tb in 1 8 16 64; do
    DELTASERVE_MOE=$moe DELTASERVE_ROUTER_TOKENS=$tb timeout 100 python3 -m deltaserve bench $M -p 512 -n 0 -b 1 \
      > "$OUT/bench.log" 2>&1
    echo "== MoE $moe router tokens $tb ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*pp' "$OUT/bench.log" | sort -u | cut -c1-110)"
  done
done
for tb in 1 8; do
  DELTASERVE_ROUTER_TOKENS=$tb timeout 100 python3 -m deltaserve bench $M -p 16 -n 32 -b 64 > "$OUT/bench.log" 2>&1
  echo "== B=64 router tokens $tb ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c1-110)"
done

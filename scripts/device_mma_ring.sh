#!/usr/bin/env bash
# Device call: the tensor-core experts kernel's register ring (AHEAD 3 .. chunks - 1 in registers; chunks - 1 is the
# whole slice requested up front in chunk order, x beside its words) at one token, where ncu showed each chunk
# waiting for its own data (AHEAD 2) or every chunk waiting behind a barrier for the last x staging (AHEAD 8).
# GPU test (every AHEAD the same bits), the experts sweep (T = 1, 8, 64), then the model at B=1 with
# DELTASERVE_MOE=mma under each ring choice against the default MoE.  ~420 s
# Usage (H200 machine, repo root): bash scripts/device_mma_ring.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests 100 tests/gpu/test_mma_gemv_gpu.py -k "whole_slice"
timeout 150 python3 scripts/sweep_mma_gemv.py --experts --ms 1,8,64 --budget-s 130 --out "$OUT/sweep_experts.jsonl" \
  > "$OUT/sweep_experts.log" 2>&1
echo "== experts kernel ($((SECONDS-t0)) s)"; grep -E "experts_" "$OUT/sweep_experts.log" | grep -v own-xs | cut -c12-125
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -n 128 -r 3 --no-record -d 512 -b 1"
for v in "cuda -" "mma -" "mma 7,7" "mma 7,1" "mma 4,4" "mma -"; do
  set -- $v
  if [ "$2" = "-" ]; then unset DELTASERVE_MMA_AHEAD; else export DELTASERVE_MMA_AHEAD=$2; fi
  DELTASERVE_MOE=$1 timeout 150 python3 -m deltaserve bench $M > "$OUT/bench.log" 2>&1
  echo "== MoE $1 ahead $2 ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c1-150)"
done
unset DELTASERVE_MMA_AHEAD
tar czf "$OUT/tcache.tgz" -C /tmp tcache && echo "triton cache packed: $(du -h "$OUT/tcache.tgz" | cut -f1)"

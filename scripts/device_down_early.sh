#!/usr/bin/env bash
# Device call: the MoE decode's down launch reading the routing and requesting its experts' weights before its PDL
# wait (DELTASERVE_MOE_DOWN_EARLY=1; gate/up opens late so the routing is complete when down starts), on the
# CUDA-core MoE and the tensor-core one (DELTASERVE_MOE=mma), and the lm_head's fp32 logits store
# (DELTASERVE_LOGITS_STORE=fp32). GPU tests first (early == late bit for bit, both MoE paths; fp32 store == bf16
# widened), then tg128 @ d512: B=1 twice for each variant, B=64 for the early down.  ~500 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
timeout 200 python3 -m pytest -m gpu -v -rf -p no:cacheprovider tests/gpu/test_gemv_gpu.py \
  tests/gpu/test_mma_gemv_gpu.py -k "down_early or fp32_out" > "$OUT/tests.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
grep -E "PASSED|FAILED|^E  " "$OUT/tests.log" | cut -c1-150 | head -20
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 512"
run() {  # run LABEL B N ENV...
  local label=$1 b=$2 n=$3; shift 3
  env "$@" timeout 90 python3 -m deltaserve bench $M -b "$b" -n "$n" > "$OUT/bench.log" 2>&1
  echo "== $label B=$b ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c50-110)"
}
for rep in 1 2; do
  run "base" 1 128 DELTASERVE_MOE_DOWN_EARLY=0
  run "down early" 1 128 DELTASERVE_MOE_DOWN_EARLY=1
  run "logits fp32" 1 128 DELTASERVE_LOGITS_STORE=fp32
done
run "mma MoE" 1 128 DELTASERVE_MOE=mma DELTASERVE_MOE_DOWN_EARLY=0
run "mma MoE, down early" 1 128 DELTASERVE_MOE=mma DELTASERVE_MOE_DOWN_EARLY=1
run "base" 64 32 DELTASERVE_MOE_DOWN_EARLY=0
run "down early" 64 32 DELTASERVE_MOE_DOWN_EARLY=1

#!/usr/bin/env bash
# Device call (prepared, not yet run): the two torch launches left outside the layers at decode. The gather before
# the final norm is gone by default (ForwardBatch.logits_all_rows, ecae135); the lm_head's fp32 store
# (DELTASERVE_LOGITS_STORE=fp32, 5cdd748) against bf16 then .float(). GPU tests first (fp32 out == bf16 widened,
# the q4 model's logits equal under both stores, eager and graph; the fast-path model's graph == eager and batch
# invariance with the gather skipped), then tg128 @ d512 B=1 (twice) and B=64 for each store.  ~330 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests 170 tests/gpu/test_mma_gemv_gpu.py tests/gpu/test_model_mma_path.py tests/gpu/test_model_fast_path.py \
  -k "fp32_out or logits_stored or batch_invariance_bit or graph_replay"
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 512"
run() {  # run LABEL B N ENV...
  local label=$1 b=$2 n=$3; shift 3
  env "$@" timeout 90 python3 -m deltaserve bench $M -b "$b" -n "$n" > "$OUT/bench.log" 2>&1
  echo "== $label B=$b ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c50-110)"
}
for rep in 1 2; do
  run "logits bf16" 1 128 DELTASERVE_LOGITS_STORE=bf16
  run "logits fp32" 1 128 DELTASERVE_LOGITS_STORE=fp32
done
run "logits bf16" 64 32 DELTASERVE_LOGITS_STORE=bf16
run "logits fp32" 64 32 DELTASERVE_LOGITS_STORE=fp32

#!/usr/bin/env bash
# Device call: the DeltaNet decode step reading its state before the PDL wait (DELTASERVE_GDN_STATE_EARLY). GPU tests
# (early == late bit for bit, the step vs fp64, the fast-path model's batch invariance / graph == eager / PDL == serial,
# the dv = 64 prep model), then tg128 @ d512 at B=1 (late, early, late, early) and B=64 (late, early).  ~300 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests ${TEST_WINDOW:-140} tests/gpu/test_kernels_gpu.py tests/gpu/test_model_fast_path.py \
  tests/gpu/test_model_mma_path.py -k "gdn_decode or batch_invariance_bit or graph_replay_equals or pdl or gdn_step_prep"
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 512"
for v in 0 1 0 1; do
  DELTASERVE_GDN_STATE_EARLY=$v timeout 100 python3 -m deltaserve bench $M -b 1 -n 128 > "$OUT/bench.log" 2>&1
  echo "== early $v B=1 ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c1-110)"
done
for v in 0 1; do
  DELTASERVE_GDN_STATE_EARLY=$v timeout 100 python3 -m deltaserve bench $M -b 64 -n 32 > "$OUT/bench64.log" 2>&1
  echo "== early $v B=64 ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench64.log" | sort -u | cut -c1-110)"
done

#!/usr/bin/env bash
# In-model A/B of the tensor-core MoE's down launch plans at batch 1 (tg32 @ d512, DELTASERVE_MOE=mma with the wide
# GEMV, no records): down's group sums its own or prep_x's (DELTASERVE_MMA_DOWN_XS=own|prep) x the combine at the
# last arrival or as a launch (DELTASERVE_MMA_COMBINE=fused|launch); then 64 streams for the default plan; the
# kernel tests the last call failed (the gated form with its own group sums), the MoE-block tests, and the default
# path's end-to-end checks (its prefill combine is now a PDL launch).
# Usage (H200 machine, repo root): bash scripts/device_mma_moe3_ab.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
t0=$SECONDS
timeout 120 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_mma_gemv_gpu.py \
  -k "forms_same_bits or moe_block or combine or own_group" > "$OUT/tests.log" 2>&1
echo "kernel tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
grep -E "^FAILED|^E  " "$OUT/tests.log" | head -6
M="--preset qwen3.6-35b-a3b --quant q4"
for plan in own:fused prep:launch own:launch prep:fused; do
  left=$((440-SECONDS+t0)); [ $left -lt 40 ] && break
  DELTASERVE_MMA_DOWN_XS=${plan%:*} DELTASERVE_MMA_COMBINE=${plan#*:} DELTASERVE_MOE=mma DELTASERVE_DECODE_GEMV=wide \
    timeout $left python3 -m deltaserve bench $M -p 16 -n 32 -d 512 -b 1 -r 5 --no-record > "$OUT/ab_$plan.log" 2>&1
  echo "$plan ($((SECONDS-t0)) s): $(grep 'tg32' "$OUT/ab_$plan.log" | sort -u | cut -d'|' -f6-7)"
done
timeout 100 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_model_fast_path.py -k "cpu_reference or pdl" \
  > "$OUT/tests_default.log" 2>&1
echo "default-path tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests_default.log" | tail -1)"
grep -E "^FAILED" "$OUT/tests_default.log" | head -4

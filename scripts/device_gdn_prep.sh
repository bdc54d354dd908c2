#!/usr/bin/env bash
# Device call: the DeltaNet decode step writing its out projection's prep (DELTASERVE_GDN_PREP=step: 30 prep
# launches fewer per step) against the prep launch (launch), tg128 @ d512 at B = 1 and 64, then the GPU tests: the
# step's prep against prep_x (xp bit for bit, xs to fp32 rounding, row alone == in batch) and the head mode end to
# end on the q4 model whose DeltaNet heads are one q4 group wide (the fused prep in use). No records.  ~250 s
# Usage (H200 machine, repo root): bash scripts/device_gdn_prep.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -n 128 -r 3 --no-record -d 512 -b 1,64"
for v in step launch step; do
  DELTASERVE_GDN_PREP=$v timeout 90 python3 -m deltaserve bench $M > "$OUT/bench_$v.log" 2>&1
  echo "== prep $v ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve.*tg" "$OUT/bench_$v.log" | sort -u
done
timeout 110 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_kernels_gpu.py \
  tests/gpu/test_model_mma_path.py -k "gdn_decode_prep or head" > "$OUT/tests.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
grep -E "^FAILED|^E  " "$OUT/tests.log" | head -8

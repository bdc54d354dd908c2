#!/usr/bin/env bash
# One device call for the tensor-core decode path (kernels/quant/mma_gemv.py, kernels/moe/mma_moe.py): its GPU
# tests (GEMV, conv epilogue, grouped experts, MoE block), the GEMV sweep with each GEMV behind its RMSNorm (as the
# model runs it), the decode MoE block CUDA cores vs tensor cores, then the model's decode in the mma and wide
# DELTASERVE_DECODE_GEMV modes at 1, 8 and 64 streams (tg32 @ d512, no records; cuda's numbers are in
# bench/NOTES.md). Fits one 600 s call.
# Usage (H200 machine, repo root): bash scripts/device_mma_ab.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
t0=$SECONDS
timeout 170 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_mma_gemv_gpu.py > "$OUT/test_mma.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/test_mma.log" | tail -1)"
grep -E "^FAILED" "$OUT/test_mma.log" | head -5
timeout 110 python3 scripts/sweep_mma_gemv.py --after-norm --budget-s 80 --ms 1,8,64 > "$OUT/sweep_after_norm.log" 2>&1
grep -A8 "^# summary" "$OUT/sweep_after_norm.log"
echo "sweep ($((SECONDS-t0)) s)"
timeout 90 python3 scripts/sweep_mma_gemv.py --moe --ms 1,8,64 --out "$OUT/sweep_moe.jsonl" > "$OUT/sweep_moe.log" 2>&1
grep "moe_" "$OUT/sweep_moe.log" | cut -c10-
echo "moe sweep ($((SECONDS-t0)) s)"
M="--preset qwen3.6-35b-a3b --quant q4"
for v in mma wide; do
  left=$((580-SECONDS+t0)); [ $left -lt 40 ] && break
  lim=120; [ $left -lt $lim ] && lim=$left
  DELTASERVE_DECODE_GEMV=$v timeout $lim python3 -m deltaserve bench $M -p 16 -n 32 -d 512 -b 1,8,64 -r 3 --no-record \
    > "$OUT/ab_$v.log" 2>&1
  echo "== $v ($((SECONDS-t0)) s)"; grep "tg32\|peak" "$OUT/ab_$v.log" | sort -u
done

#!/usr/bin/env bash
# One device call for the tensor-core paths (kernels/quant/mma_gemv.py, kernels/moe/mma_moe.py): the end-to-end GPU
# tests on the q4 model (DELTASERVE_MOE=mma with DELTASERVE_DECODE_GEMV=mma, now with the DeltaNet conv in the
# tensor-core GEMV's epilogue) and on the default path, the conv-epilogue kernel tests, the experts kernel's
# W x RB x tile-rows sweep, then the model's decode with the tensor-core MoE and each decode GEMV mode (mma, wide)
# at 1 and 64 streams (tg32 @ d512, no records; bench/NOTES.md has the numbers to compare with). Fits one 600 s call.
# Usage (H200 machine, repo root): bash scripts/device_mma_ab.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
timeout 230 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_model_mma_path.py \
  tests/gpu/test_model_fast_path.py "tests/gpu/test_mma_gemv_gpu.py::test_mma_gemv_conv" > "$OUT/tests.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
grep -E "^FAILED|^E  " "$OUT/tests.log" | head -8
timeout 100 python3 scripts/sweep_mma_gemv.py --experts --ms 1,64,512 --budget-s 80 --out "$OUT/sweep_experts.jsonl" \
  > "$OUT/sweep_experts.log" 2>&1
grep -c " ok$" "$OUT/sweep_experts.log"; grep -E "FAIL|ERROR" "$OUT/sweep_experts.log" | head -3
echo "experts sweep ($((SECONDS-t0)) s)"
M="--preset qwen3.6-35b-a3b --quant q4"
for v in mma wide; do
  left=$((580-SECONDS+t0)); [ $left -lt 60 ] && break
  DELTASERVE_MOE=mma DELTASERVE_DECODE_GEMV=$v timeout $left python3 -m deltaserve bench $M -p 16 -n 32 -d 512 -b 1,64 \
    -r 3 --no-record > "$OUT/ab_$v.log" 2>&1
  echo "== moe mma + gemv $v ($((SECONDS-t0)) s)"; grep "tg32\|peak" "$OUT/ab_$v.log" | sort -u
done

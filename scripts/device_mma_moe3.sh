#!/usr/bin/env bash
# One device call for the tensor-core MoE in three launches (router, gate/up, down + combine at the last arrival,
# down's group sums its own): the kernel and end-to-end GPU tests, the MoE block sweep (CUDA-core vs tensor cores at
# 1 / 8 / 64 tokens), the experts kernel's W x AHEAD x own-sums sweep, then the model's decode at 1 and 64 streams:
# the default (CUDA-core MoE) and DELTASERVE_MOE=mma with the wide GEMV (tg32 @ d512, no records).
# Usage (H200 machine, repo root): bash scripts/device_mma_moe3.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
timeout 250 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_mma_gemv_gpu.py \
  tests/gpu/test_model_mma_path.py > "$OUT/tests.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
grep -E "^FAILED|^E  " "$OUT/tests.log" | head -8
timeout 60 python3 scripts/sweep_mma_gemv.py --moe --ms 1,8,64 --budget-s 50 --out "$OUT/sweep_moe.jsonl" \
  > "$OUT/sweep_moe.log" 2>&1
echo "== moe block ($((SECONDS-t0)) s)"; grep -E "moe_" "$OUT/sweep_moe.log" | cut -c1-140
timeout 90 python3 scripts/sweep_mma_gemv.py --experts --ms 1,64 --budget-s 75 --out "$OUT/sweep_experts.jsonl" \
  > "$OUT/sweep_experts.log" 2>&1
echo "== experts ($((SECONDS-t0)) s)"; grep -E "experts_" "$OUT/sweep_experts.log" | cut -c12-140
M="--preset qwen3.6-35b-a3b --quant q4"
for v in cuda mma; do
  left=$((585-SECONDS+t0)); [ $left -lt 60 ] && break
  DELTASERVE_MOE=$v DELTASERVE_DECODE_GEMV=$([ $v = mma ] && echo wide || echo cuda) timeout $left \
    python3 -m deltaserve bench $M -p 16 -n 32 -d 512 -b 1,64 -r 3 --no-record > "$OUT/ab_$v.log" 2>&1
  echo "== moe $v ($((SECONDS-t0)) s)"; grep "tg32\|peak" "$OUT/ab_$v.log" | sort -u
done
timeout 100 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_model_fast_path.py -k "cpu_reference or pdl" \
  > "$OUT/tests_default.log" 2>&1
echo "default-path tests (CPU reference, PDL == serial) ($((SECONDS-t0)) s): $(grep -E 'passed|failed|no tests' "$OUT/tests_default.log" | tail -1)"

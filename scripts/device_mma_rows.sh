#!/usr/bin/env bash
# Device calls for what the last window prepared on the tensor-core kernels (kernels/quant/mma_gemv.py): the GEMV's
# launch shape by rows (RB 2 past 16 rows for K <= 2048, AHEAD 2 for K = 4096), its conv epilogue spread over the
# warps, the whole weight slice requested at once (AHEAD = every chunk, a sweep option, GEMV and experts kernel),
# the Gluon PDL wait as a compiler barrier, the experts kernel's rounds of row blocks over x staged once (LOOP, a
# sweep option).
#   part "check": kernel and end-to-end GPU tests (both paths, and the one-launch expert tiles), then the GEMV sweep at 1 and 8 rows and the experts sweep at
#                 1 / 64 / 512 tokens (every AHEAD and LOOP);  ~500 s
#   part "bench": the model in tensor-core mode at 1 / 8 / 64 streams (tg128 @ d512 and pp512; records when
#                 DELTASERVE_COMMIT is set);  ~150 s
# Usage (H200 machine, repo root): [DELTASERVE_COMMIT=<sha>] bash scripts/device_mma_rows.sh check|bench
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
if [ "${1:-check}" = check ]; then
  timeout 300 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_mma_gemv_gpu.py \
    tests/gpu/test_model_mma_path.py tests/gpu/test_model_fast_path.py "tests/gpu/test_kernels_gpu.py::test_expert_tiles" \
    > "$OUT/tests.log" 2>&1
  echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
  grep -E "^FAILED|^E  " "$OUT/tests.log" | head -8
  timeout 95 python3 scripts/sweep_mma_gemv.py --ms 1,8 --budget-s 80 --out "$OUT/sweep_gemv.jsonl" \
    > "$OUT/sweep_gemv.log" 2>&1
  echo "== GEMV sweep ($((SECONDS-t0)) s)"; grep -E "mma_gemv|affine_gemv" "$OUT/sweep_gemv.log" | cut -c12-125
  timeout 115 python3 scripts/sweep_mma_gemv.py --experts --ms 1,64,512 --budget-s 100 \
    --out "$OUT/sweep_experts.jsonl" > "$OUT/sweep_experts.log" 2>&1
  echo "== experts sweep ($((SECONDS-t0)) s)"; grep -E "experts_" "$OUT/sweep_experts.log" | cut -c12-150
else
  M="--preset qwen3.6-35b-a3b --quant q4"
  REC=$([ -n "${DELTASERVE_COMMIT:-}" ] && echo "--results $OUT" || echo "--no-record")
  DELTASERVE_MOE=mma DELTASERVE_DECODE_GEMV=mma timeout 560 python3 -m deltaserve bench $M -p 512 -n 128 -d 512 \
    -b 1,8,64 -r 3 $REC > "$OUT/bench.log" 2>&1
  echo "== tensor-core mode ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve|peak" "$OUT/bench.log" | sort -u
fi

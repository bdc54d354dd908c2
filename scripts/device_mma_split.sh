#!/usr/bin/env bash
# Device call (prepared, not yet run): the tensor-core MoE's split gate/up layout (DELTASERVE_MMA_GATE_UP=split:
# one plain launch over stacked [gate; up] rows, twice the gated launch's programs at about 64% of its SASS per warp,
# h = SiLU(g) * u at each block pair's second arrival). GPU tests (the gated launch's bits: hidden, g | u, the
# block, the glu-at-load fallback), the MoE block sweep (gated vs split, T = 1, 8, 64, 512), then the model:
# tg128 @ d512 B=1 and 64, pp512, gated vs split.  ~420 s
# Usage (H200 machine, repo root): bash scripts/device_mma_split.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests 120 tests/gpu/test_mma_gemv_gpu.py -k "split or moe_block"
timeout 120 python3 scripts/sweep_mma_gemv.py --moe --ms 1,8,64,512 --budget-s 100 --out "$OUT/sweep_moe.jsonl" \
  > "$OUT/sweep_moe.log" 2>&1
echo "== MoE blocks ($((SECONDS-t0)) s)"; grep -E "moe_" "$OUT/sweep_moe.log" | cut -c12-130
M="--preset qwen3.6-35b-a3b --quant q4 -n 128 -r 3 --no-record -d 512"
for v in "gated -p 16 -b 1" "split -p 16 -b 1" "gated -p 16 -b 1" "split -p 512 -b 1,64" "gated -p 512 -b 64"; do
  set -- $v
  DELTASERVE_MOE=mma DELTASERVE_MMA_GATE_UP=$1 timeout 120 python3 -m deltaserve bench $M $2 $3 $4 $5 \
    > "$OUT/bench.log" 2>&1
  echo "== $v ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve" "$OUT/bench.log" | sort -u | cut -c1-110
done

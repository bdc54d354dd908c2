#!/usr/bin/env bash
# Device call: the tensor-core MoE's input norm making x's group sums from its registers (a pairwise tree whose
# order is prep_row's in any layout) instead of storing y and reading it back; then the tensor-core MoE against
# the CUDA-core one at batch 1 (tg128 @ d512, twice each). GPU tests first: the norms (sums == the pairwise tree,
# == prep_x's, at N = 2048), the q4 model in the mma-moe mode (vs the CPU reference, batch invariance, graph ==
# eager).  ~300 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
timeout 200 python3 -m pytest -m gpu -v -rf -p no:cacheprovider tests/gpu/test_kernels_gpu.py \
  tests/gpu/test_model_mma_path.py -k "norms or mma-moe" > "$OUT/tests.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
grep -E "PASSED|FAILED|^E  " "$OUT/tests.log" | cut -c1-150 | head -20
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 512"
run() {  # run LABEL B N ENV...
  local label=$1 b=$2 n=$3; shift 3
  env "$@" timeout 90 python3 -m deltaserve bench $M -b "$b" -n "$n" > "$OUT/bench.log" 2>&1
  echo "== $label B=$b ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c50-110)"
}
for rep in 1 2; do
  run "CUDA-core MoE" 1 128 DELTASERVE_MOE=cuda
  run "tensor-core MoE" 1 128 DELTASERVE_MOE=mma
done

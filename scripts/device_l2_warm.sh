#!/usr/bin/env bash
# (Its A/B and tests ran in wave 43 inside device_l2_warm_kv.sh on an H100 at 3aaca3f: the L2 warm lost in every
# form and was removed after it, so this script no longer runs on main; bench/NOTES.md wave 43 has the numbers.)
# The L2 warm in the model (DELTASERVE_L2_WARM: next = the batch-1 gate/up launch touches the next layer's input
# projection; all = and the DeltaNet step its out projection): tg64 @ d512 B=1 off / all / next alternating, the GPU
# tests (same bits: the block, the step, the model), the graph profile under all.  ~330 s on a warm Triton cache
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
for mode in off all next off all next; do bench_tg "warm=$mode" 1 64 DELTASERVE_L2_WARM=$mode; done
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_mma_gemv_gpu.py tests/gpu/test_kernels_gpu.py \
  tests/gpu/test_model_mma_path.py -k "l2_warm"
DELTASERVE_L2_WARM=all timeout 100 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 --no-record -p 16 \
  -n 32 -d 512 -b 1 -r 2 --profile-graph --profile-top 16 > "$OUT/graph_all.log" 2>&1
echo "== graph profile all ($((SECONDS-t0)) s)"; grep -A26 "decode graph profile" "$OUT/graph_all.log" | cut -c1-120

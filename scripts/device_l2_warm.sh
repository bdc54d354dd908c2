#!/usr/bin/env bash
# Wave 42, call 3: the L2 warm in the model (DELTASERVE_L2_WARM=next: the batch-1 gate/up launch touches the next
# layer's input projection): its GPU tests, tg64 @ d512 B=1 off / next alternating, the graph profile with it on.
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_mma_gemv_gpu.py -k "l2_warm" tests/gpu/test_model_mma_path.py::test_l2_warm_equals_off
for mode in off next off next; do bench_tg "warm=$mode" 1 64 DELTASERVE_L2_WARM=$mode; done
BENCH_ARGS="${BENCH_ARGS/-d 512/-d 32768}"
for mode in off next; do bench_tg "warm=$mode d32768" 1 64 DELTASERVE_L2_WARM=$mode; done
DELTASERVE_L2_WARM=next timeout 120 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 --no-record -p 16 \
  -n 32 -d 512 -b 1 -r 2 --profile-graph --profile-top 16 > "$OUT/graph_next.log" 2>&1
echo "== graph profile next ($((SECONDS-t0)) s)"; grep -A30 "decode graph profile" "$OUT/graph_next.log" | cut -c1-120

#!/usr/bin/env bash
# Device call: the router's logits for many tokens from the multi-row GEMV (DELTASERVE_ROUTER_ROWS_MIN, default 128;
# the same bits as the per-token launch). GPU tests (router rows == per-token at the 35B-A3B's router shape, T up
# to 515; the q4 model on the tensor-core paths against the CPU reference, batch invariance, graphs; the prefill
# and decode graphs of the engine), then pp512 with the rows path against the per-token launch (B=1 twice, B=8),
# and 64 streams with the rows path from 64 tokens.  ~330 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg, bench_pp
TESTS_NAMED=1 gpu_tests 60 tests/gpu/test_kernels_gpu.py -k "router"
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_model_mma_path.py tests/gpu/test_engine_graph_gpu.py
for rep in 1 2; do
  bench_pp "router per token" 1 DELTASERVE_ROUTER_ROWS_MIN=0
  bench_pp "router rows" 1
done
bench_pp "router rows" 8
bench_tg "router per token" 64 128 DELTASERVE_ROUTER_ROWS_MIN=0
bench_tg "router rows from 64" 64 128 DELTASERVE_ROUTER_ROWS_MIN=64
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: down's two 64-row sets at a 64-stream decode (8-row tiles), and the GPU tests at the new defaults.
# Call 2's probe at 64 tokens: down 58.8 us (two groups a step, one set: the old default) -> 48.3 (two sets) ->
# 45.5 (two sets, one group a step). (1) GPU tests: the MoE block on the wgmma kernel == mma.sync at 3 / 300 / 512
# tokens (the new defaults at 8- and 16-row tiles), the kernel == mma.sync at 64 / 512, the tensor-core model
# paths and the engine's graphs (window); (2) tg64 @ d512 at 64 streams: one set, two, two + one group a step, in
# ABBA order; B=1 for the record (no batch-1 decode kernel changed).
# Prediction: 64 streams +4% with two sets (-10.5 us of the 271 us a layer's step), +1% more with one group.  ~420 s
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_down_sets32.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_wgmma_experts_gpu.py -k "test_moe_block_wgmma_same_bits or (test_wg_experts_same_bits_as_mma and (64 or 512))"
gpu_tests 130 tests/gpu/test_model_mma_path.py tests/gpu/test_engine_graph_gpu.py
ONE="DELTASERVE_MOE_WGMMA_DOWN_SETS=0"
G1="DELTASERVE_MOE_WGMMA_DOWN_GROUPS=0"
bench_tg "one set (before)" 64 64 $ONE
bench_tg "two sets" 64 64 X=1
bench_tg "two sets, one group a step" 64 64 $G1
bench_tg "two sets, one group a step" 64 64 $G1
bench_tg "two sets" 64 64 X=1
bench_tg "one set (before)" 64 64 $ONE
bench_tg "default" 1 64 X=1
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

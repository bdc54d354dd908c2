#!/usr/bin/env bash
# Device call: the router launch that also builds the expert tiles (triton_route_tiles) - its GPU tests, the q4
# model on the warpgroup-MMA MoE from one row (so every decode step takes the fused launch), then the in-model A/B at
# 64 streams (fused against split, twice each) and the 64-stream graph profile with it.
# Prediction: the split top-k (3.05 us a layer) and the tiles' sort (8.83) go, the router grows by its last
# arrivals' top-k and the bitmap's tiles (~3-4 us): 64 streams ~+2.5-3% (5,850 -> ~6,000).  ~330 s
# Usage (H200 machine, repo root; carry .whl and .tcache.txz): bash scripts/device_route_tiles.sh
source "$(dirname "$0")/device_env.sh"
TESTS_NAMED=1 gpu_tests 170 tests/gpu/test_kernels_gpu.py tests/gpu/test_model_mma_path.py \
  -k "route_tiles or router_last_arrival or mma-moe-wgmma"
for v in fused split fused split; do bench_tg "$v" 64 64 DELTASERVE_MOE_ROUTE_TILES=$v; done
timeout 100 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 -n 32 -d 512 -b 64 -r 1 \
  --no-record --profile-graph > "$OUT/graph64.log" 2>&1
grep -E "step span|_router|_topk|_tiles|_wg_experts|_combine" "$OUT/graph64.log" | head -12
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the router launch that also builds the expert tiles (triton_route_tiles), after a first call's compile error
# (a module global read inside the kernel; the interpreter allowed it, sm_90 compiles now): its GPU tests and the q4
# model on the warpgroup-MMA MoE from one row, the in-model A/B at 64 streams (fused against split, twice each),
# down's own shared-memory slots (DELTASERVE_MOE_WGMMA_DOWN_STAGES 7@8 / 9@8 against the gated launch's 5), then the
# 64-stream graph profile.
# Predictions: fused: the split top-k (3.05 us a layer) and the tiles' sort (8.83) go, the router grows by ~3-4 us:
# 64 streams +2.5-3%. Down at 9 slots (all 8 groups of K = 512 in flight): 53 -> ~45 us, +3%.  ~400 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_route_tiles2.sh
source "$(dirname "$0")/device_env.sh"
TESTS_NAMED=1 gpu_tests 170 tests/gpu/test_kernels_gpu.py tests/gpu/test_model_mma_path.py \
  -k "route_tiles or router_last_arrival or mma-moe-wgmma"
for v in fused split fused split; do bench_tg "route $v" 64 64 DELTASERVE_MOE_ROUTE_TILES=$v; done
for ns in 7@8 9@8 0 9@8; do bench_tg "down stages $ns" 64 64 DELTASERVE_MOE_WGMMA_DOWN_STAGES=$ns; done
timeout 100 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 -n 32 -d 512 -b 64 -r 1 \
  --no-record --profile-graph > "$OUT/graph64.log" 2>&1
grep -E "step span|_router|_topk|_tiles|_wg_experts|_combine" "$OUT/graph64.log" | head -12
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

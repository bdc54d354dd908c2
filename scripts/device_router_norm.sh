#!/usr/bin/env bash
# Device call: the MoE's input norm made inside the router launch at decode sizes (route_normed,
# DELTASERVE_ROUTER_NORM=fused|split; the norms' sum of squares now one pairwise tree, triton_norm.rms_inverse):
# its GPU tests (route_normed == add_rms_norm then the router at the 35B router, 1-16 tokens; the norms vs fp64; the
# fused routing's tiles; the q4 model in the tensor-core MoE modes: CPU reference whole and chunked, batch
# invariance alone vs among 63 others (fused vs the norm kernel), graph == eager, fused == split logits), then the
# in-model A/B at batch 1 (twice each) and 8 streams, 64 streams once, and the batch-1 graph profile.
# Prediction: the post-attention norm's 1.88 us critical a layer goes and the router grows by ~0.6 (its loads of x
# and the residual, the tree, a scratch row's store and reload): batch 1 +3% (640 -> ~660), 8 streams +1-2%.  ~450 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_router_norm.sh
source "$(dirname "$0")/device_env.sh"
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_kernels_gpu.py tests/gpu/test_model_mma_path.py \
  -k "router_norm or test_norms or route_tiles or mma-moe"
for v in split fused split fused; do bench_tg "router norm $v" 1 64 DELTASERVE_ROUTER_NORM=$v; done
for v in split fused; do bench_tg "router norm $v" 8 64 DELTASERVE_ROUTER_NORM=$v; done
bench_tg "default" 64 64
timeout 100 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 -n 32 -d 512 -b 1 -r 1 \
  --no-record --profile-graph > "$OUT/graph1.log" 2>&1
grep -E "step span|_router|_topk|_rms_norm|_mma_experts|_gemv_kernel" "$OUT/graph1.log" | head -12
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

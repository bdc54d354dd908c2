#!/usr/bin/env bash
# Device call (prepared, not yet run): how the normed router reads its norm's row (DELTASERVE_ROUTER_NORM_READ):
# "tiles" makes y's values again at the dot product's x loads instead of a scratch row stored, fenced and read back.
# GPU tests (route_normed both ways == add_rms_norm then the router at the 35B router; the q4 model's mma-moe mode:
# fused == split logits, batch invariance, graph == eager), then batch 1 twice each way. Prediction: the router's
# 2.52 us of critical time a layer (1.40 without the norm) -> ~2.1: batch 1 ~+1%.  ~230 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_router_norm_read.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_kernels_gpu.py tests/gpu/test_model_mma_path.py \
  -k "test_moe_router_norm or (mma-moe] and (invariance or graph or router_norm))"
DELTASERVE_ROUTER_NORM_READ=tiles TESTS_NAMED=1 gpu_tests 100 tests/gpu/test_model_mma_path.py \
  -k "mma-moe] and (invariance or graph or router_norm)"
for v in scratch tiles scratch tiles; do bench_tg "router norm read $v" 1 64 DELTASERVE_ROUTER_NORM_READ=$v; done
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: three batch-1 changes, GPU tests first. (1) The normed router's tiles read (prepared last wave,
# DELTASERVE_ROUTER_NORM_READ=tiles; predicted router 2.52 -> ~2.1 us a layer: +1%). (2) The gated launch's shared-
# slot programs requesting their first chunks before the PDL wait (DELTASERVE_MOE_SHARED_EARLY=1; predicted gate/up
# 7.3 -> ~6.7 us of critical time a layer: +1.5%). (3) The batch-1 decode merge's columns at 32K
# (DELTASERVE_ATTN_MERGE 128x16 / 256x16 against 128x32: 256 programs instead of 128 reading the 512 splits'
# partials; 128x16 the same bits; predicted the merge ~9 -> ~5 us a layer at 32K: d32768 +2%).  ~560 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_w29_ab.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 100 tests/gpu/test_mma_gemv_gpu.py tests/gpu/test_kernels_gpu.py \
  -k "shared_early or down_early or test_moe_router_norm or test_paged_attention"
DELTASERVE_ROUTER_NORM_READ=tiles DELTASERVE_MOE_SHARED_EARLY=1 TESTS_NAMED=1 gpu_tests 90 \
  tests/gpu/test_model_mma_path.py -k "mma-moe] and (invariance or graph or router_norm)"
for v in base tiles shared both both shared tiles base; do
  env=(); [[ $v = tiles || $v = both ]] && env+=(DELTASERVE_ROUTER_NORM_READ=tiles)
  [[ $v = shared || $v = both ]] && env+=(DELTASERVE_MOE_SHARED_EARLY=1)
  bench_tg "$v" 1 64 "${env[@]}" DELTASERVE_UNUSED=0
done
BENCH_ARGS="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 32768" BENCH_TIMEOUT=120
for m in auto 128x16 256x16 auto; do bench_tg "merge $m d32768" 1 64 DELTASERVE_ATTN_MERGE=$m; done
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call (wave 38, second session): the prefill's out projections dequantised ahead on a side stream
# (fast.dequant_ahead, DELTASERVE_PREFILL_DEQUANT_AHEAD=side) beside the conv / fla's rule / the attention, which
# leave SMs idle. Bits first (ahead == in line, whole and chunked, and inside a captured prefill graph; the conv
# change's chunked == whole on the final kernel; the dense tests), then pp512 B=1 ABAB off / side, the prefill
# graph's profile with it, 8 prompts off / side. Predicted: of the out projections' 40 x 8.9 us dequantisation
# ~5 us a layer hidden, pp512 B=1 +1% (and the conv's 15.4 -> 11.5 us a layer: +0.7% against the records);
# 8 prompts (4,096-row chunks: every projection on dequant) ~+0.5%. The Triton cache is cold (~+150 s). ~560 s.
# Run once at 65d92b0 (its feature reverted after: bench/NOTES.md).
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz if any): bash scripts/device_ahead38.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 240 tests/gpu/test_wgmma_dense_gpu.py tests/gpu/test_kernels_gpu.py \
  tests/gpu/test_engine_graph_gpu.py -k "dense or ahead or conv or prefill_graph"
PP_TIMEOUT=240 bench_pp "warm-up (cold cache), off" 1 DELTASERVE_PREFILL_DEQUANT_AHEAD=off
for rep in 1 2; do
  bench_pp "ahead off" 1 DELTASERVE_PREFILL_DEQUANT_AHEAD=off
  bench_pp "ahead side" 1
done
prefill_profile 16
PP_TIMEOUT=150 bench_pp "ahead off" 8 DELTASERVE_PREFILL_DEQUANT_AHEAD=off
PP_TIMEOUT=150 bench_pp "ahead side" 8
logs_into_one
rm -f "$OUT/pp.log"
cache_news
echo "done ($((SECONDS-t0)) s)"

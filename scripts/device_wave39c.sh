#!/usr/bin/env bash
# Device call (wave 39, fourth): the prefill attention at 5 stages as the default (3e39e6f) and the prefill graph's
# staged load (8a6fde0) under the GPU tests, then where a pp512's wall time goes outside the graph's kernels (bench
# times load_batch + replay + synchronize: 18.87 ms at d0 in the last records against the graph profile's 18.24 ms
# span), the staged load against the plain one it replaced. Predicted: the plain load ~140 us (4 pageable copies,
# ~10 small device ops, the GPU idle meanwhile), the staged ~30 us: pp512 B=1 +0.5%. Then the records.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): DELTASERVE_COMMIT=<sha> bash scripts/device_wave39c.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_kernels_gpu.py tests/gpu/test_engine_graph_gpu.py \
  -k "paged_attention or prefill_graph"
timeout 120 python3 scripts/probe_prefill_host.py --depths 0,512 --reps 20 \
  > "$OUT/probe_host.log" 2>&1
grep -E "^\||equal" "$OUT/probe_host.log"; grep -E "rror" "$OUT/probe_host.log" | tail -3
echo "== records ($((SECONDS-t0)) s)"
bench_records 150 120
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

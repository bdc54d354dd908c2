#!/usr/bin/env bash
# Device call: the prefill without its torch copies of column views (DELTASERVE_PREFILL_COPIES=none): the gated
# norm reads z in place from the fused in-projection's output, the prefill attention applies the output gate in its
# epilogue (the decode epilogue's _gated). The batch-1 prefill profile had 40 clones (7.2 us each, 0.29 ms) plus
# the attention gate's sigmoid and product by torch. GPU tests: the norm and attention kernels (in place == copied,
# gated vs fp64), the bf16 fast path (CPU reference whole and chunked, invariance, graph == eager), the engine's
# prefill graphs == eager, the q4 mma-moe model against the CPU reference; then pp512 B=1 (ABBA) and 8 prompts each
# way. Prediction: pp512 B=1 ~24.1 -> ~23.7 ms: +1.5%; 8 prompts +1%.  ~330 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_prefill_copies.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 80 tests/gpu/test_kernels_gpu.py -k "test_norms or test_paged_attention"
TESTS_NAMED=1 gpu_tests 120 tests/gpu/test_model_fast_path.py tests/gpu/test_engine_graph_gpu.py \
  -k "matches_cpu_reference or batch_invariance or graph_replay or prefill_graph"
for v in torch none none torch; do bench_pp "copies $v" 1 DELTASERVE_PREFILL_COPIES=$v; done
for v in torch none; do bench_pp "copies $v" 8 DELTASERVE_PREFILL_COPIES=$v; done
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

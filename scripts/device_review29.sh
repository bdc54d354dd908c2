#!/usr/bin/env bash
# Device call (review): the settled decode attention now shares the split kernel's header instead of a program
# helper of its own (sm_90 bf16: 155 registers against the measured form's 158, 2,088 SASS against 2,080; the plain
# form hash-identical), and the tests' environment switches go through one helper. GPU tests of what they touch,
# then batch 1 at d512 with the settled form off and on (ABBA): it should keep the measured +2.0%.  ~180 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_review29.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 70 tests/gpu/test_kernels_gpu.py tests/gpu/test_gemv_gpu.py \
  -k "test_paged_attention or settled or state_early or test_gemv_conv_early"
for v in 0 1 1 0; do bench_tg "kv early $v" 1 64 DELTASERVE_ATTN_KV_EARLY=$v; done
logs_into_one
echo "done ($((SECONDS-t0)) s)"

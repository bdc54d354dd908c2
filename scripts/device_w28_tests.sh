#!/usr/bin/env bash
# Device call: the wave's remaining GPU tests: the bf16 fast-path model (every norm on the pairwise tree: the CPU
# reference, batch invariance, graph == eager, PDL == serial) and the q4 model's mma mode (the tensor-core GEMVs with
# the normed router).  ~200 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_w28_tests.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 230 tests/gpu/test_model_fast_path.py tests/gpu/test_model_mma_path.py \
  -k "test_model_fast_path or (mma] or mma-) and not wgmma and not mma-moe and not wg-"
logs_into_one
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the plain norms back on tl.sum (DELTASERVE_NORM_TREE=residual, the default: only add_rms_norm, which
# the router launch repeats, sums by the tree). The records' batch-1 profile had the 41 plain norms at 2.25 us of
# critical time against 1.88 before the tree. GPU tests (the norms vs fp64, the normed router, the bf16 fast-path
# model and the q4 model's mma-moe mode: batch invariance, graph == eager, the CPU reference in chunks of 1), then
# batch 1 and 64 streams under both settings. Prediction: batch 1 +1% (41 x 0.37 us), 64 streams ~+0.2%.  ~330 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_norm_tree.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_kernels_gpu.py tests/gpu/test_model_fast_path.py \
  tests/gpu/test_model_mma_path.py -k "test_norms or test_moe_router_norm or (test_model_fast_path and (invariance or \
graph_replay or reference)) or (mma-moe] and (invariance or graph or router_norm)) or mma-moe-1]"
for v in all residual all residual; do bench_tg "norm tree $v" 1 64 DELTASERVE_NORM_TREE=$v; done
for v in all residual; do bench_tg "norm tree $v" 64 64 DELTASERVE_NORM_TREE=$v; done
logs_into_one
echo "done ($((SECONDS-t0)) s)"

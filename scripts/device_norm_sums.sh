#!/usr/bin/env bash
# Device call: the tensor-core MoE's input norm making x's group sums from its registers (a pairwise tree whose
# order is prep_row's in any layout) instead of storing y and reading it back; then the tensor-core MoE against
# the CUDA-core one at batch 1 (tg128 @ d512, twice each). GPU tests first: the norms (sums == the pairwise tree,
# == prep_x's, at N = 2048), the q4 model in the mma-moe mode (vs the CPU reference, batch invariance, graph ==
# eager).  ~300 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_kernels_gpu.py tests/gpu/test_model_mma_path.py -k "norms or mma-moe"
for rep in 1 2; do
  bench_tg "CUDA-core MoE" 1 128 DELTASERVE_MOE=cuda
  bench_tg "tensor-core MoE" 1 128 DELTASERVE_MOE=mma
done

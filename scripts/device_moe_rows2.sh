#!/usr/bin/env bash
# Wave 46, call 4: the GPU tests of the experts kernels and the q4 model at the new defaults (the warpgroup-MMA MoE
# from 144 rows, its tile sets from 16 tokens), then at 32 and 16 streams the 8-row tiles' shared-memory slots
# (3 / default 5 / 7) and the mixers' halves from that batch's rows, against the default.
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_moe_rows2.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
gpu_tests 260 tests/gpu/test_wgmma_experts_gpu.py tests/gpu/test_model_mma_path.py tests/gpu/test_mma_gemv_gpu.py
export BENCH_TIMEOUT=150
for b in 32 16; do
  bench_tg "default" $b 64
  bench_tg "slots 3" $b 64 DELTASERVE_MOE_WGMMA_STAGES=3@8
  bench_tg "slots 7" $b 64 DELTASERVE_MOE_WGMMA_STAGES=7@8
  bench_tg "mixer halves" $b 64 DELTASERVE_MIXER_HALVES=$b
done
bench_tg "default" 64 64
logs_into_one
echo "done ($((SECONDS-t0)) s)"

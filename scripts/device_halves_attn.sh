#!/usr/bin/env bash
# Wave 45's third call (~6 min on a warm Triton cache): the attention mixers as two halves too
# (DELTASERVE_MIXER_HALVES_ATTN=1): the GPU tests (every mixer's halves == one launch, eager and graphed, in every
# q4 mode), then tg64 @ d512 at 64 streams: DeltaNet halves (the default) / attention too / none, twice each.
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_halves_attn.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
TESTS_NAMED=1 gpu_tests 220 tests/gpu/test_model_mma_path.py -k halves
for i in 1 2; do
  bench_tg "deltanet halves" 64 64
  bench_tg "attention too" 64 64 DELTASERVE_MIXER_HALVES_ATTN=1
  bench_tg "none" 64 64 DELTASERVE_MIXER_HALVES=0
done
logs_into_one
echo "done ($((SECONDS-t0)) s)"

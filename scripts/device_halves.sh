#!/usr/bin/env bash
# Wave 45's second call (~7 min on a warm Triton cache): the DeltaNet mixers as two halves on two streams in the
# model (fast.mixer_halves, from 48 rows): the GPU tests (halves == one launch eager and graphed in every q4 mode;
# batch invariance at 64 rows in the mma mode), then tg64 @ d512 at 64 streams, halves against one launch
# (DELTASERVE_MIXER_HALVES=0), alternating twice, then the 64-stream graph profile with the halves.
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_halves.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_model_mma_path.py -k halves
gpu_tests 100 "tests/gpu/test_model_mma_path.py::test_q4_mma_batch_invariance_bit_for_bit[mma]"
bench_tg "halves" 64 64
bench_tg "one launch" 64 64 DELTASERVE_MIXER_HALVES=0
bench_tg "halves" 64 64
bench_tg "one launch" 64 64 DELTASERVE_MIXER_HALVES=0
timeout 150 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 --no-record -p 16 -n 32 -d 512 -b 64 -r 2 \
  --profile-graph --profile-top 16 > "$OUT/profile64.log" 2>&1
echo "== graph profile B=64 ($((SECONDS-t0)) s)"; grep -A36 "decode graph profile" "$OUT/profile64.log" | cut -c1-150
logs_into_one
echo "done ($((SECONDS-t0)) s)"

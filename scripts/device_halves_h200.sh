#!/usr/bin/env bash
# Wave 45's last call: on an H200, the mixers' halves against none at 64 streams (tg64 @ d512) and the records at
# this tree (DELTASERVE_COMMIT); on any other card, the bf16 tiny model's GPU tests with the halves in use
# (batch invariance at 64 rows, graph == eager, PDL == serial). ~4 min on a warm Triton cache.
# Usage (repo root; carry .whl, .tcache.tgz): DELTASERVE_COMMIT=<sha> bash scripts/device_halves_h200.sh
source "$(dirname "$0")/device_env.sh"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
if [[ $gpu == *H200* ]]; then
  bench_tg "halves" 64 64
  bench_tg "none" 64 64 DELTASERVE_MIXER_HALVES=0
  bench_records 120 90
else
  TESTS_NAMED=1 gpu_tests 240 tests/gpu/test_model_fast_path.py -k "batch_invariance or graph_replay or pdl"
fi
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

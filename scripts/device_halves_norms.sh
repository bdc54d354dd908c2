#!/usr/bin/env bash
# (No longer runs on main: the norms-in-the-halves form was removed after this call; it needs the tree at 9070968.)
# Wave 45's last call (~3 min on a warm Triton cache): the layers' norms inside the halves
# (DELTASERVE_MIXER_HALVES_NORMS=1, DecoderLayer._forward_halves): its GPU tests in three q4 modes (halves == one
# launch, eager and graphed), then tg64 @ d512 at 64 streams, norms in the halves against the mixers alone, twice.
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_halves_norms.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
T=tests/gpu/test_model_mma_path.py::test_mixer_halves_equal_one_launch
TESTS_NAMED=1 gpu_tests 120 "$T[mma-1]" "$T[head-1]" "$T[mma-moe-1]"
for i in 1 2; do
  bench_tg "norms in the halves" 64 64 DELTASERVE_MIXER_HALVES_NORMS=1
  bench_tg "mixers alone" 64 64 DELTASERVE_MIXER_HALVES_NORMS=0
done
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

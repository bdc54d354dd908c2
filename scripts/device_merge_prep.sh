#!/usr/bin/env bash
# Device call (wave 41): the decode attention's merge writing the out projection's GEMV prep
# (DELTASERVE_ATTN_MERGE_PREP=merge; paged_decode_attention(prep=)), against the prep launch (launch, the default).
# First its GPU tests (the kernel == the plain launch then prep_x bit for bit at the 35B shapes up to 32K, both merge
# shapes; the q4 model of head_dim 64: logits == the launch mode's eager and replayed, batch invariance, graph ==
# eager), then tg64 at batch 1 @ d512 alternating, @ d32768, and the batch-1 graph profile with the merge's prep.
# Predicted: the prep launch's 1.20 us of critical time a layer (H100) goes, the merge (BD 64 instead of 32: 116
# registers, 904 SASS against 72 / 520) grows ~0.3-0.5 us: batch 1 ~+0.5% at d512, ~+0.2% at d32768.
# Usage (repo root; carry .whl and .tcache.tgz): DELTASERVE_COMMIT=<sha> [PROFILE=1] bash scripts/device_merge_prep.sh
# (~400 s with a seeded Triton cache; PROFILE=1 adds the graph profile, ~30 s)
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests ${TEST_WINDOW:-150} tests/gpu/test_kernels_gpu.py tests/gpu/test_model_mma_path.py -k "merge_prep"
BENCH_TIMEOUT=150 bench_tg "warm-up launch d512" 1 64 DELTASERVE_ATTN_MERGE_PREP=launch
for mode in merge launch merge launch; do
  bench_tg "prep $mode d512" 1 64 DELTASERVE_ATTN_MERGE_PREP=$mode
done
for mode in merge launch; do
  BENCH_ARGS="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 32768" BENCH_TIMEOUT=120 \
    bench_tg "prep $mode d32768" 1 64 DELTASERVE_ATTN_MERGE_PREP=$mode
done
[ "${PROFILE:-0}" = 1 ] || { logs_into_one; echo "done ($((SECONDS-t0)) s)"; exit 0; }
env DELTASERVE_ATTN_MERGE_PREP=merge timeout 90 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 \
  -p 16 -n 32 -d 512 -b 1 -r 3 --no-record --profile-graph > "$OUT/profile_merge.log" 2>&1
echo "== graph profile merge ($((SECONDS-t0)) s)"; grep -A24 "decode graph profile" "$OUT/profile_merge.log" | cut -c1-120
logs_into_one
echo "done ($((SECONDS-t0)) s)"

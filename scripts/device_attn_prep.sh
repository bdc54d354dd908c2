#!/usr/bin/env bash
# Device call (prepared in wave 40 without a device; run in wave 41 at 9e4e9fd on an H100: split lost, -0.3% @ d512,
# -1.4% @ d32768, and the knob and its kernel form were removed after it, so this script no longer runs on main): the decode attention making its own q / k prep
# (DELTASERVE_ATTN_PREP=split: paged_decode_attention(prep=), the q/k prep launch folded into the settled split
# programs, sm_90 168 registers at PREP_MAXNREG against the settled form's 158). First its GPU tests (the kernel ==
# the prep launch's rows form then the settled decode bit for bit, its race test under PDL, the rows form vs fp64,
# the model's split == rows eager and in a graph), then tg64 at batch 1 @ d512 and d32768 and 64 streams @ d512,
# launch / rows / split alternating in one call. Predicted: the q/k prep's 2.67 us of critical time a layer goes
# and the split kernel grows ~0.9 us (the norms, one more L2 round trip in the program holding the newest token):
# B=1 +1.2% at d512 (~675 -> ~683), +1% at d32768; rows alone -0.2% (its tree); 64 streams within noise.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): DELTASERVE_COMMIT=<sha> bash scripts/device_attn_prep.sh
# [a|b]: a (the default, ~450 s) the tests and batch 1 @ d512; b (~500 s) batch 1 @ d32768, 64 streams and the
# batch-1 graph profile each way (the split kernel's critical time against the prep + split pair).
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
part=${1:-a}
if [ "$part" = a ]; then
  TESTS_NAMED=1 gpu_tests 170 tests/gpu/test_kernels_gpu.py tests/gpu/test_model_fast_path.py \
    -k "decode_attention_prep or attention_prep_in_the_decode or qk_norm_rope_write or settled"
  # MODES: the order of the A/B (a cold Triton cache makes the first one slow: BENCH_TIMEOUT=200 then)
  for mode in ${MODES:-launch split rows split launch}; do
    bench_tg "prep $mode d512" 1 64 DELTASERVE_ATTN_PREP=$mode
  done
else
  for mode in launch split launch split; do
    BENCH_ARGS="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 32768" BENCH_TIMEOUT=120 \
      bench_tg "prep $mode d32768" 1 64 DELTASERVE_ATTN_PREP=$mode
  done
  for mode in launch split; do
    bench_tg "prep $mode" 64 64 DELTASERVE_ATTN_PREP=$mode
  done
  for mode in launch split; do
    env DELTASERVE_ATTN_PREP=$mode timeout 90 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 \
      -n 32 -d 512 -b 1 -r 3 --no-record --profile-graph > "$OUT/profile_$mode.log" 2>&1
    echo "== graph profile $mode ($((SECONDS-t0)) s)"; grep -A30 "decode graph profile" "$OUT/profile_$mode.log" \
      | cut -c1-140
  done
fi
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

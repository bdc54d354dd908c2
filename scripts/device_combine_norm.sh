#!/usr/bin/env bash
# Ran once at a8b1c96 (bench/NOTES.md): the fused combine was refuted and reverted (b522cd1), so its knob is gone.
# Device call: the MoE decode's combine making the next layer's input norm (DELTASERVE_COMBINE_NORM=fused, one
# launch fewer per layer) against the combine launch then the norm (split). GPU tests first (the fused kernel ==
# combine then rms_norm bit for bit at 1 / 5 / 64 tokens, then the fast-path model: against the CPU reference,
# batch invariance, graph == eager), the A/B at B=1 (twice) and B=64, then the records at DELTASERVE_COMMIT.  ~420 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests 150 tests/gpu/test_kernels_gpu.py tests/gpu/test_model_fast_path.py \
  -k "combine_norm or test_norms or fast_path or batch_invariance or graph"
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 512"
run() {  # run LABEL B N ENV...
  local label=$1 b=$2 n=$3; shift 3
  env "$@" timeout 90 python3 -m deltaserve bench $M -b "$b" -n "$n" > "$OUT/bench.log" 2>&1
  echo "== $label B=$b ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c50-110)"
}
for rep in 1 2; do
  run split 1 128 DELTASERVE_COMBINE_NORM=split
  run fused 1 128 DELTASERVE_COMBINE_NORM=fused
done
run split 64 32 DELTASERVE_COMBINE_NORM=split
run fused 64 32 DELTASERVE_COMBINE_NORM=fused
[ -n "${DELTASERVE_COMMIT:-}" ] && TEST_TIMEOUT=1 bash scripts/device_bench_all.sh > "$OUT/records.log" 2>&1 &&
  echo "== records ($((SECONDS-t0)) s)" && grep -hE "^\| deltaserve" "$OUT/records.log" | sort -u | cut -c1-150

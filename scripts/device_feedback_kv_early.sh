#!/usr/bin/env bash
# Ran once at fc6c1de (bench/NOTES.md); the early K/V read was reverted after it (refuted), so its knob is gone.
# Device call: the one-kernel embedding lookup (DELTASERVE_EMBED), the greedy feedback in two kernels
# (DELTASERVE_GREEDY_FEEDBACK) and the decode attention's early K/V read (DELTASERVE_ATTN_KV_EARLY), each against
# the step before it, then the top-k recomputed in every gate/up program (DELTASERVE_MOE_TOPK=fused) on top.
# GPU tests first: the three kernels against their references (early == late bit for bit), then the fast-path
# model's graph == eager and batch invariance. B=1 tg128 @ d512 (twice) and @ d32768.  ~420 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests 150 tests/gpu/test_kernels_gpu.py tests/gpu/test_model_fast_path.py \
  -k "kv_early or affine_embed or greedy_advance or graph or batch_invariance"
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -b 1"
run() {  # run LABEL DEPTH ENV...
  local label=$1 d=$2; shift 2
  env "$@" timeout 90 python3 -m deltaserve bench $M -d "$d" -n 128 > "$OUT/bench.log" 2>&1
  echo "== $label @ d$d ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c50-110)"
}
BASE="DELTASERVE_EMBED=torch DELTASERVE_GREEDY_FEEDBACK=torch DELTASERVE_ATTN_KV_EARLY=0"
for rep in 1 2; do
  run "base (torch embed, torch feedback)" 512 $BASE
  run "+ embed kernel" 512 $BASE DELTASERVE_EMBED=kernel
  run "+ greedy kernels" 512 $BASE DELTASERVE_EMBED=kernel DELTASERVE_GREEDY_FEEDBACK=kernel
  run "+ kv early" 512 DELTASERVE_ATTN_KV_EARLY=1
done
run "+ kv early + fused top-k" 512 DELTASERVE_ATTN_KV_EARLY=1 DELTASERVE_MOE_TOPK=fused
run "embed + greedy, kv late" 32768 DELTASERVE_ATTN_KV_EARLY=0
run "embed + greedy, kv early" 32768 DELTASERVE_ATTN_KV_EARLY=1

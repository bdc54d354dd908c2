#!/usr/bin/env bash
# Device call: the prefill MoE's launch shapes in the model. Call 1's probe (CUDA graphs, 512 tokens): the gated
# launch 175.2 -> 161.6 us with two groups a step, down 113.9 -> 126.6 (hence a switch a launch: gated 2 everywhere,
# down 2 at 8-row tiles only); here also down's two 64-row sets a program (row_sets=2: x read once per 128 weight
# rows, 116 registers on sm_90 against 79).
# (1) GPU tests: row sets == one set bit for bit (T = 1 / 64 / 512), two groups a step == one (T = 512);
# (2) the probe at 64 (a 64-stream decode's 8-row tiles), 512, 4,096 tokens: down sets 1 / 2 x slots 3 / 5 x GS;
# (3) pp512 @ d0 B=1 in ABBA order: before (gated GS 1 at 16-row tiles), the new default, + down row sets 2@16;
#     8 prompts for each; (4) the eager prefill profile (fla's kernels by name).
# Predictions: pp512 B=1 +2.5% for gated GS 2 (-14 us a layer of ~560); row sets: down 114 -> ~90 us at 512 tokens
# (+4%) if x's copies and the programs' fixed latency are what bind it, or slower if 3 programs an SM instead of 6
# leave fewer loads in flight.  ~520 s
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_prefill_experts32b.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 170 tests/gpu/test_wgmma_experts_gpu.py -k "test_wg_row_sets_same_bits or (test_wg_step_groups_same_bits and 512)"
timeout 150 python3 scripts/probe_prefill_experts.py --t 64,512,4096 --gated-ns 3 --down-ns 3,5 --gs 1,2 --sets 1,2 \
  --out "$OUT/probe-prefill-experts.jsonl" > "$OUT/probe.log" 2>&1; echo "probe rc $? ($((SECONDS-t0)) s)"
grep -E "^T=|^\|" "$OUT/probe.log" | tail -34; grep -E "Error|error" "$OUT/probe.log" | grep -v '"error": ""' | head -5
OLD="DELTASERVE_MOE_WGMMA_GROUPS=2@8"
SETS="DELTASERVE_MOE_WGMMA_DOWN_SETS=2@16"
bench_pp "before (gated GS 1 @16)" 1 $OLD
bench_pp "gated GS 2" 1 X=1
bench_pp "gated GS 2 + down sets 2@16" 1 $SETS
bench_pp "gated GS 2" 1 X=1
bench_pp "before (gated GS 1 @16)" 1 $OLD
bench_pp "gated GS 2 + down sets 2@16" 1 $SETS
bench_pp "before (gated GS 1 @16)" 8 $OLD
bench_pp "gated GS 2" 8 X=1
bench_pp "gated GS 2 + down sets 2@16" 8 $SETS
timeout 100 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 0 -b 1 -r 2 \
  --profile-prefill > "$OUT/pp_prof.log" 2>&1; echo "profile rc $? ($((SECONDS-t0)) s)"
grep -iE "chunk|fwd|fla|solve|kkt|cumsum|experts|total" "$OUT/pp_prof.log" | head -30
cache_news
echo "done ($((SECONDS-t0)) s)"

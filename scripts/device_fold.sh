#!/usr/bin/env bash
# Device call: the partial sums 0 and 2 folded as soon as both are complete (DELTASERVE_WGMMA_FOLD=1, three partial
# sums held instead of four: sm_90 gated 16-row tiles 167 -> 163 registers, and under a 128 cap 24 bytes of stack
# outside the loops against 64; the 32-row form 255 + 16 of stack -> 252; wg_gemv 32-row 164 -> 125). Bits first
# (fold == mma.sync, cap + fold == neither, the row sets and input checks), then the probe at 512 / 4,096 tokens
# (graph-timed gated launch: fold, the 128 cap at 16-row tiles = 4 programs an SM), then pp512 B=1 in the model.
# ~520 s.  Usage (H200 machine, repo root; carry .whl[, .tcache.tgz]): bash scripts/device_fold.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
T=tests/gpu/test_wgmma_experts_gpu.py
TESTS_NAMED=1 gpu_tests 170 $T::test_wg_experts_input_checks $T::test_wg_row_sets_same_bits $T::test_wg_register_cap_same_bits \
  "$T::test_wg_experts_same_bits_as_mma[64]" "$T::test_wg_experts_same_bits_as_mma[512]" \
  "$T::test_wg_gemv_same_bits_as_mma_gemv[12352-2048]"
timeout 90 python3 scripts/probe_prefill_experts.py --t 512,4096 --gs default --gated-ns 3 --down-ns "" \
  --env base:DELTASERVE_WGMMA_FOLD=0 --env fold:DELTASERVE_WGMMA_FOLD=1 \
  --env cap128:DELTASERVE_WGMMA_FOLD=0,DELTASERVE_WGMMA_MAXNREG=128@16 \
  --env fold+cap128:DELTASERVE_WGMMA_FOLD=1,DELTASERVE_WGMMA_MAXNREG=128@16 \
  --out "$OUT/probe.jsonl" > "$OUT/probe.log" 2>&1; echo "probe rc $? ($((SECONDS-t0)) s)"; grep -E "^\|" "$OUT/probe.log"
PP_TIMEOUT=240 bench_pp "base" 1 DELTASERVE_WGMMA_FOLD=0
bench_pp "fold+cap128@16" 1 DELTASERVE_WGMMA_FOLD=1 DELTASERVE_WGMMA_MAXNREG=128@16
bench_pp "base" 1 DELTASERVE_WGMMA_FOLD=0
bench_pp "fold+cap128@16" 1 DELTASERVE_WGMMA_FOLD=1 DELTASERVE_WGMMA_MAXNREG=128@16
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

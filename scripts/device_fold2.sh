#!/usr/bin/env bash
# Device call: the fold (DELTASERVE_WGMMA_FOLD=1) at a 64-stream decode and 8-prompt prefill in the model. sm_90:
# the gated 8-row form 124 -> 116 registers (at a 96 cap no stack: 5 programs an SM instead of 4), wg_gemv at
# 32-row tiles (the in_proj and q|k|v at 64 rows) 164 -> 125 (4 programs an SM instead of 3); 8 prompts' 32-row
# gated form 255 + 16 bytes of stack -> 252. Then the engine's graphs with the fold on (the model's paths).
# ~500 s.  Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_fold2.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
BENCH_TIMEOUT=150 bench_tg "base" 64 64 DELTASERVE_WGMMA_FOLD=0 DELTASERVE_WGMMA_MAXNREG=128@8
bench_tg "fold" 64 64 DELTASERVE_WGMMA_FOLD=1 DELTASERVE_WGMMA_MAXNREG=128@8
bench_tg "fold+cap96@8" 64 64 DELTASERVE_WGMMA_FOLD=1 DELTASERVE_WGMMA_MAXNREG=96@8,128@16
bench_tg "base" 64 64 DELTASERVE_WGMMA_FOLD=0 DELTASERVE_WGMMA_MAXNREG=128@8
bench_tg "fold+cap96@8" 64 64 DELTASERVE_WGMMA_FOLD=1 DELTASERVE_WGMMA_MAXNREG=96@8,128@16
PP_TIMEOUT=150 bench_pp "base" 8 DELTASERVE_WGMMA_FOLD=0 DELTASERVE_WGMMA_MAXNREG=128@8
bench_pp "fold+cap128@16" 8 DELTASERVE_WGMMA_FOLD=1 DELTASERVE_WGMMA_MAXNREG=128@16
DELTASERVE_WGMMA_FOLD=1 DELTASERVE_WGMMA_MAXNREG=96@8,128@16 TESTS_NAMED=1 gpu_tests 90 tests/gpu/test_engine_graph_gpu.py
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call (prepared, not yet run): the experts kernel's weight words through shared-memory slots filled by
# cp.async (WSTAGE; x staged whole, the scales in registers) at prefill sizes. ncu's source view at 512 tokens
# (bench/NOTES.md, 2026-12-01): down's stalls are 61% on its weight words, and more chunks in registers were slower
# (AHEAD 2 -> 3 .. 8: 111.9 -> 118.5 .. 141.2 us). (1) GPU test: every slot count's bits equal the register forms';
# (2) sweep_mma_gemv.py --experts at T = 512, 4096, 64 over the slots (each checked bit for bit and against fp64);
# (3) pp512 in the model with DELTASERVE_MMA_WSTAGE="gated,down" slot counts.  ~420 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_pp
TESTS_NAMED=1 gpu_tests 120 tests/gpu/test_mma_gemv_gpu.py -k "staged_weights"
timeout 150 python3 scripts/sweep_mma_gemv.py --experts --ms 512,4096,64 --aheads 2 --loops "" --own-xs own \
  --wstages 2,3,4,5,9 --budget-s 130 --out "$OUT/sweep.jsonl" > "$OUT/sweep.log" 2>&1
echo "== sweep ($((SECONDS-t0)) s)"; grep -vE "^\s*$" "$OUT/sweep.log" | tail -40 | cut -c1-160
for ws in 0,0 0,3 0,5 3,3 5,5; do bench_pp "WSTAGE $ws" 1 DELTASERVE_MMA_WSTAGE=$ws; done
bench_pp "WSTAGE 0,0" 8; bench_pp "WSTAGE 0,3" 8 DELTASERVE_MMA_WSTAGE=0,3
echo "done ($((SECONDS-t0)) s)"

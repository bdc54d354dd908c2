#!/usr/bin/env bash
# Device call: the DeltaNet decode step's persistent form (gdn_decode_step(programs=): at most P programs, each
# taking every P-th block of [128, 32] state columns with the next block's state requested before the current one
# is computed; sm_90: 153 registers, 3 programs an SM) and the state's row stride as a constant (the plain form
# 96 -> 72 registers, the loads at immediate offsets). (1) GPU tests: the step's forms bit for bit and against fp64,
# batch invariance across 1 / 4 / 16 / 64 rows (the plain form below 396 blocks, the loop above), the tiny q4 model's
# tensor-core paths; (2) the step sweep at 8 and 64 streams over 0 / 2 / 3 / 4 programs an SM; (3) tg64 @ d512 at 64
# streams: the default (3 an SM), off, 2, 4, the default again. Predicted: 88 -> ~70 us a layer, 64 streams +4%.
# Usage (H200 machine, repo root): bash scripts/device_gdn_loop.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg
TESTS_NAMED=1 gpu_tests 120 tests/gpu/test_kernels_gpu.py -k "gdn_decode"
TESTS_NAMED=1 gpu_tests 60 tests/gpu/test_wgmma_experts_gpu.py -k "xs_smem"
timeout 80 python3 scripts/sweep_gdn_step.py --bs 64,8 --programs 0,2,3,4 --configs 32x4,64x4 --budget-s 60 \
  --out "$OUT/sweep_gdn.jsonl" > "$OUT/sweep_gdn.log" 2>&1
echo "== gdn step sweep ($((SECONDS-t0)) s)"; grep -E "us|FAIL|Error" "$OUT/sweep_gdn.log" | cut -c12-120 | tail -20
BENCH_TIMEOUT=150 bench_tg default 64 64
for cfg in "DELTASERVE_GDN_STEP_PROGRAMS=0" "DELTASERVE_GDN_STEP_PROGRAMS=2" "DELTASERVE_GDN_STEP_PROGRAMS=4" ""; do
  bench_tg "${cfg:-default}" 64 64 $cfg
done
TESTS_NAMED=1 gpu_tests 100 tests/gpu/test_model_mma_path.py -k "mma-moe and not wgmma"
tar czf "$OUT/tcache.tgz" -C /tmp tcache && split -b 15M "$OUT/tcache.tgz" "$OUT/tcache.tgz." && rm "$OUT/tcache.tgz"
cat "$OUT"/tests*.log > "$OUT/all_tests.txt" && rm "$OUT"/tests*.log "$OUT/bench.log"  # 8 files come back at most
echo "done ($((SECONDS-t0)) s)"

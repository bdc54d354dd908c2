#!/usr/bin/env bash
# Device call (ran at 5b3275d): the DeltaNet decode step's persistent form (at most P programs, each taking every
# P-th block of [128, 32] state columns with the next block's state requested ahead; 153 registers, 3 programs an
# SM; since removed) against one program per block, with the state's row stride a constant (the plain form 96 -> 72
# registers). GPU tests, the step sweep at 8 and 64 streams over 0 / 2 / 3 / 4 programs an SM, tg64 @ d512 at 64
# streams. Measured (bench/NOTES.md): the persistent form 4,953 / 4,947, 2 an SM 4,461, 4 an SM 4,569; one program
# per block with the constant stride 5,529.
# Usage (H200 machine, repo root, at 5b3275d): bash scripts/device_gdn_loop.sh
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
logs_into_one
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: decode-sized expert tiles placed by rank (DELTASERVE_TILES_ONE=rank: cdiv(M, 64) programs, each
# counting the rows of a smaller (expert, row) key; sm_90 167 registers, no stack) against one program's sort (8.8
# us a MoE block at 64 streams in the 26113e4 graph profile), and the lm_head on 64-row wg_gemv tiles past 32 rows
# (probe 392 -> 353 us at 64 rows). (1) GPU tests: the tile kernels against the torch reference in both forms, the
# tiny q4 model's tensor-core MoE (CPU reference, batch invariance, graph == eager); (2) tg64 @ d512 A/B: 64 streams
# default / sort / lm_head on 32-row tiles / default; 8 streams and batch 1 default / sort. Predicted: tiles 8.8 ->
# ~3 us a block (64 streams +2%), the lm_head -39 us a step (+0.3%); (3) records at this commit.  ~420 s
# Ran at ded2f0d (measured: bench/NOTES.md; the rank form lost 1.0% and is removed since, so DELTASERVE_TILES_ONE
# is gone too). Usage (H200 machine, repo root, at ded2f0d): DELTASERVE_COMMIT=<sha> bash scripts/device_tiles_rank.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg, bench_records
TESTS_NAMED=1 gpu_tests 60 tests/gpu/test_kernels_gpu.py -k "expert_tiles"
TESTS_NAMED=1 gpu_tests 90 tests/gpu/test_model_mma_path.py -k "mma-moe and not wgmma"
for cfg in "" "DELTASERVE_TILES_ONE=sort" "DELTASERVE_MMA_GEMV_WG_BN=32" ""; do bench_tg "${cfg:-default}" 64 64 $cfg; done
for b in 8 1; do
  for cfg in "" "DELTASERVE_TILES_ONE=sort"; do bench_tg "${cfg:-default}" $b 64 $cfg; done
done
bench_records 150 110
logs_into_one
ls "$OUT"; echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: decode-sized expert tiles placed by rank (DELTASERVE_TILES_ONE=rank: cdiv(M, 64) programs, each
# counting the rows of a smaller (expert, row) key; sm_90 167 registers, no stack) against one program's sort (8.8
# us a MoE block at 64 streams in the 26113e4 graph profile), and the lm_head on 64-row wg_gemv tiles past 32 rows
# (probe 392 -> 353 us at 64 rows). (1) GPU tests: the tile kernels against the torch reference in both forms, the
# tiny q4 model's tensor-core MoE (CPU reference, batch invariance, graph == eager); (2) tg64 @ d512 A/B: 64 streams
# default / sort / lm_head on 32-row tiles / default; 8 streams and batch 1 default / sort. Predicted: tiles 8.8 ->
# ~3 us a block (64 streams +2%), the lm_head -39 us a step (+0.3%); (3) records at this commit.  ~420 s
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_tiles_rank.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg
TESTS_NAMED=1 gpu_tests 60 tests/gpu/test_kernels_gpu.py -k "expert_tiles"
TESTS_NAMED=1 gpu_tests 90 tests/gpu/test_model_mma_path.py -k "mma-moe and not wgmma"
for cfg in "" "DELTASERVE_TILES_ONE=sort" "DELTASERVE_MMA_GEMV_WG_BN=32" ""; do bench_tg "${cfg:-default}" 64 64 $cfg; done
for b in 8 1; do
  for cfg in "" "DELTASERVE_TILES_ONE=sort"; do bench_tg "${cfg:-default}" $b 64 $cfg; done
done
M="--preset qwen3.6-35b-a3b --quant q4"
timeout 150 python3 -m deltaserve bench $M -p 512 -n 128 -d 512 -b 64,8 -r 3 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b64.log"; grep -E "^\| deltaserve" "$OUT/bench_b64.log" | sort -u
timeout 110 python3 -m deltaserve bench $M -p 512 -n 128 -d 0,512,4096,8192,32768 -b 1 -r 5 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b1.log"; grep -E "^\| deltaserve" "$OUT/bench_b1.log" | sort -u
cat "$OUT"/tests*.log > "$OUT/all_tests.txt" && rm -f "$OUT"/tests*.log "$OUT/bench.log"  # 8 files come back at most
ls "$OUT"; echo "done ($((SECONDS-t0)) s)"

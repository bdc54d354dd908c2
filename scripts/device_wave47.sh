#!/usr/bin/env bash
# Prepared for the next wave (not run). Three calls on a warm Triton cache, each under the 600 s limit:
# a (~5 min): wave 46's open checks.
#   1. The GPU tests of the tile sets with TILE0 a constexpr (after the records) and of the default-paths fixtures
#      (fb5f0a8), then the test files whose window closed in wave 46's call 6.
#   2. pp512 @ d512 with 8 and 64 prompts at this tree, twice (the H200 records at dc44618 had 42,821 and 39,951
#      against 1bcd6db's 44,511 and 41,963; the joint experts launches' SASS is 56bd6bc's again), and tg64 @ d512 at
#      64 streams for the machine's reference.
# b (~5 min): wave 47's long-row decode splits (DELTASERVE_ATTN_LONG_SPLIT, off by default): their GPU tests (32K
#   rows at the 35B shapes; the settled form under PDL with a late writer), then the sweep at 32K / 8K / 512, batch
#   1, against the default (the split kernel alone and with the merge).
# c (~5 min): the same in the model: tg64 B=1 @ d32768 off / 8192x2 / 8192x4 / 8192x2 at 2 stages (LONG_STAGES) /
#   off, and d512 off / 8192x2 (d512 rows are short: the same bits, only the kernel's 168 registers against 158
#   could move it).
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_wave47.sh a|b|c
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
case "${1:-a}" in
a)
  TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_wgmma_experts_gpu.py tests/gpu/test_model_mma_path.py -k "tile_sets or prep"
  gpu_tests 240 tests/gpu/test_wgmma_experts_gpu.py tests/gpu/test_mma_gemv_gpu.py -k "not tile_sets"
  for i in 1 2; do
    timeout 150 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 512 -b 8,64 -r 3 \
      --no-record > "$OUT/pp_multi.log" 2>&1
    echo "== pp512 @ d512 run $i ($((SECONDS-t0)) s):"; grep -E '^\| deltaserve.*pp' "$OUT/pp_multi.log" | sort -u | cut -c50-110
  done
  bench_tg "default" 64 64
  ;;
b)
  TESTS_NAMED=1 gpu_tests 260 tests/gpu/test_kernels_gpu.py -k "long_split or settled_reads"
  timeout 230 python3 scripts/sweep_decode_attention.py --depths 32768,8192,512 --bs 1 --budget-s 210 \
    --shapes "64,64,lib,lib,128,32;64,64,lib,lib,128,32,-,8192x2;64,64,lib,2,128,32,-,8192x2;64,64,lib,lib,128,32,-,8192x4;64,64,lib,lib,128,32,-,2048x2" \
    --out "$OUT/sweep_long.jsonl" > "$OUT/sweep_long.log" 2>&1
  echo "== sweep ($((SECONDS-t0)) s):"; grep -E " bf16 " "$OUT/sweep_long.log" | cut -c1-150
  ;;
c)
  export BENCH_TIMEOUT=110 BENCH_ARGS="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 32768"
  bench_tg "d32768 off" 1 64 DELTASERVE_ATTN_LONG_SPLIT=off
  bench_tg "d32768 8192x2" 1 64 DELTASERVE_ATTN_LONG_SPLIT=8192x2
  bench_tg "d32768 8192x4" 1 64 DELTASERVE_ATTN_LONG_SPLIT=8192x4
  timeout 110 python3 scripts/bench_attention_pick.py --set "LONG_SPLIT=(8192, 2)" --set LONG_STAGES=2 -- \
    $BENCH_ARGS -b 1 -n 64 > "$OUT/bench.log" 2>&1
  echo "== d32768 8192x2, 2 stages ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c50-110)"
  bench_tg "d32768 off" 1 64 DELTASERVE_ATTN_LONG_SPLIT=off
  export BENCH_ARGS="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 512"
  bench_tg "d512 off" 1 64 DELTASERVE_ATTN_LONG_SPLIT=off
  bench_tg "d512 8192x2" 1 64 DELTASERVE_ATTN_LONG_SPLIT=8192x2
  ;;
esac
logs_into_one
echo "done ($((SECONDS-t0)) s)"

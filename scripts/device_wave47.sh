#!/usr/bin/env bash
# Prepared for the next wave (not run; ~6 min on a warm Triton cache): wave 46's open checks.
# 1. The GPU tests of the tile sets with TILE0 a constexpr (after the records) and of the default-paths fixtures
#    (fb5f0a8), then the test files whose window closed in wave 46's call 6.
# 2. pp512 @ d512 with 8 and 64 prompts at this tree, twice (the H200 records at dc44618 had 42,821 and 39,951
#    against 1bcd6db's 44,511 and 41,963; the joint experts launches' SASS is 56bd6bc's again), and tg64 @ d512 at
#    64 streams for the machine's reference.
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_wave47.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_wgmma_experts_gpu.py tests/gpu/test_model_mma_path.py -k "tile_sets or prep"
gpu_tests 240 tests/gpu/test_wgmma_experts_gpu.py tests/gpu/test_mma_gemv_gpu.py -k "not tile_sets"
for i in 1 2; do
  timeout 150 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 512 -b 8,64 -r 3 \
    --no-record > "$OUT/pp_multi.log" 2>&1
  echo "== pp512 @ d512 run $i ($((SECONDS-t0)) s):"; grep -E '^\| deltaserve.*pp' "$OUT/pp_multi.log" | sort -u | cut -c50-110
done
bench_tg "default" 64 64
logs_into_one
echo "done ($((SECONDS-t0)) s)"

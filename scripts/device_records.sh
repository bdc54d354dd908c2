#!/usr/bin/env bash
# Device call (warm machine after device_next.sh, its Triton cache in /tmp): (1) the wgmma GPU tests that the cold
# call's window cut (wg_gemv through the dispatch with the conv launched and in the epilogue, the register cap), the
# tiny q4 model in the tensor-core modes; (2) tg64 @ d512 at 64 streams with both prepared knobs that each gained
# (the conv in wg_gemv's epilogue +0.4%, the MoE's 8-row tiles at 5 slots +0.3%) against the default; (3) records at
# this commit's defaults (the row split and the 8-row register cap of 5b1d4bb have an A/B and no records).  ~500 s
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_records.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg
TESTS_NAMED=1 gpu_tests 100 tests/gpu/test_wgmma_experts_gpu.py -k "through_wg_gemv or register_cap"
TESTS_NAMED=1 gpu_tests 80 tests/gpu/test_model_mma_path.py -k "not moe and not head"
bench_tg default 64 64
bench_tg both 64 64 DELTASERVE_WG_GEMV_CONV=epilogue DELTASERVE_MOE_WGMMA_STAGES=5@8
M="--preset qwen3.6-35b-a3b --quant q4"
timeout 170 python3 -m deltaserve bench $M -p 512 -n 128 -d 512 -b 64,8 -r 3 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b64.log"; grep -E "^\| deltaserve" "$OUT/bench_b64.log" | sort -u
timeout 110 python3 -m deltaserve bench $M -p 512 -n 128 -d 0,512,4096,8192,32768 -b 1 -r 5 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b1.log"; grep -E "^\| deltaserve" "$OUT/bench_b1.log" | sort -u
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: (1) GPU tests of the launch-shape knobs (mma_gemv's row split for K = 4096, the wgmma register cap:
# both bit for bit against the plain launches); (2) the row split's probe at the out projection; (3) tg64 @ d512 at
# 64 streams per split / cap variant and pp512 @ d0 with and without the cap; records first, after the tests, at
# this commit's defaults (wg_gemv from 17 rows; split and cap off): 64 and 8 streams, each its own deployment.  ~450 s
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_final.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg, bench_pp
TESTS_NAMED=1 gpu_tests 100 tests/gpu/test_mma_gemv_gpu.py tests/gpu/test_wgmma_experts_gpu.py -k "row_split or register_cap"
M="--preset qwen3.6-35b-a3b --quant q4"
timeout 170 python3 -m deltaserve bench $M -p 512 -n 128 -d 512 -b 64,8 -r 3 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b64.log"; grep -E "^\| deltaserve" "$OUT/bench_b64.log"
echo "== records ($((SECONDS-t0)) s)"
timeout 60 python3 scripts/probe_wg_gemv.py --shapes "" --split --out "$OUT/probe.jsonl" > "$OUT/probe.log" 2>&1
echo "== probe ($((SECONDS-t0)) s)"; grep -E "DIFFER|differ|Error|error" "$OUT/probe.log" | cut -c1-160
grep -E "^\|" "$OUT/probe.log"
bench_tg "default" 64 64
bench_tg "split 16" 64 64 DELTASERVE_MMA_GEMV_SPLIT_ROWS=16
bench_tg "split 32 cap 128" 64 64 DELTASERVE_MMA_GEMV_SPLIT_ROWS=32 DELTASERVE_MMA_GEMV_SPLIT_MAXNREG=128
bench_tg "wgmma cap 128@8" 64 64 DELTASERVE_WGMMA_MAXNREG=128@8
bench_tg "wgmma cap 128" 64 64 DELTASERVE_WGMMA_MAXNREG=128
bench_pp "default" 1
bench_pp "wgmma cap 128" 1 DELTASERVE_WGMMA_MAXNREG=128
tar czf "$OUT/tcache.tgz" -C /tmp tcache && split -b 15M "$OUT/tcache.tgz" "$OUT/tcache.tgz." && rm "$OUT/tcache.tgz"
echo "done ($((SECONDS-t0)) s)"

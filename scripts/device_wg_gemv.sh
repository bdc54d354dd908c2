#!/usr/bin/env bash
# Device call: the dense decode GEMV on warpgroup MMAs (wgmma_experts.wg_gemv: 64 weight rows a program, so x is read
# once per 64 weight rows instead of once per 16-32; mma_gemv's bits). (1) the probe at the K = 2048 decode linears,
# 16 / 32 / 64 rows (every form checked bit for bit against mma_gemv first); (2) tg64 @ d512 at 64 streams with it
# from 64 rows, 16- and 32-row tiles, and without; (3) GPU tests: wg_gemv == mma_gemv bit for bit (shapes, 1-100
# rows, tile widths, slots, sums, fp32 out), mma_gemv's dispatch to it with and without the conv, the tiny q4 model
# with it from one row.  ~560 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg
timeout 120 python3 scripts/probe_wg_gemv.py --ms 16,32,64 --bn 8,16,32,64 --ns 3 --out "$OUT/probe.jsonl" \
  > "$OUT/probe.log" 2>&1
echo "== probe ($((SECONDS-t0)) s)"; grep -E "DIFFER|differ|Error|error" "$OUT/probe.log" | cut -c1-160
grep -E "^\|" "$OUT/probe.log"
bench_tg "wg off" 64 64 DELTASERVE_MMA_GEMV_WG_ROWS=0
bench_tg "wg 64 rows, BN 16" 64 64 DELTASERVE_MMA_GEMV_WG_ROWS=64 DELTASERVE_MMA_GEMV_WG_BN=16
bench_tg "wg 64 rows, BN 32" 64 64 DELTASERVE_MMA_GEMV_WG_ROWS=64 DELTASERVE_MMA_GEMV_WG_BN=32
TESTS_NAMED=1 gpu_tests 130 tests/gpu/test_wgmma_experts_gpu.py -k "wg_gemv"
TESTS_NAMED=1 gpu_tests 60 tests/gpu/test_model_mma_path.py -k "wg-gemv"
tar czf "$OUT/tcache.tgz" -C /tmp tcache && split -b 15M "$OUT/tcache.tgz" "$OUT/tcache.tgz." && rm "$OUT/tcache.tgz"
echo "done ($((SECONDS-t0)) s)"

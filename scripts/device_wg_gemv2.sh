#!/usr/bin/env bash
# Device call: wg_gemv after call 1 (bench/NOTES.md): the conv of its dispatch in place fixed (the conv kernel now
# writes y after its last read of x), the GPU tests again, the probe at 32 / 64 rows with 3 / 5 / 8 shared-memory
# slots (call 1: 25.6 us for the DeltaNet in_proj at 64 rows with 3 slots, ~0.8 us a group: latency), tg64 @ d512 at
# 64 streams per slot count, and the tiny q4 model with wg_gemv from one row.  ~470 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg
timeout 150 python3 scripts/probe_wg_gemv.py --ms 32,64 --bn 16,32,64 --ns 3,5,8 --out "$OUT/probe.jsonl" \
  > "$OUT/probe.log" 2>&1
echo "== probe ($((SECONDS-t0)) s)"; grep -E "DIFFER|differ|Error|error" "$OUT/probe.log" | cut -c1-160
grep -E "^\|" "$OUT/probe.log"
bench_tg "wg off" 64 64 DELTASERVE_MMA_GEMV_WG_ROWS=0
for cfg in "32 3" "32 5" "32 8" "64 5" "16 8"; do set -- $cfg
  bench_tg "wg from 32 rows, BN $1 NS $2" 64 64 DELTASERVE_MMA_GEMV_WG_ROWS=32 DELTASERVE_MMA_GEMV_WG_BN=$1 \
    DELTASERVE_MMA_GEMV_WG_NS=$2
done
TESTS_NAMED=1 gpu_tests 130 tests/gpu/test_wgmma_experts_gpu.py -k "wg_gemv"
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_model_mma_path.py -k "wg-gemv"
tar czf "$OUT/tcache.tgz" -C /tmp tcache && split -b 15M "$OUT/tcache.tgz" "$OUT/tcache.tgz." && rm "$OUT/tcache.tgz"
echo "done ($((SECONDS-t0)) s)"

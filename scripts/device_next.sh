#!/usr/bin/env bash
# Device call (prepared, not yet run): (1) GPU tests of the prepared forms: wg_gemv's conv in its epilogue
# (DELTASERVE_WG_GEMV_CONV=epilogue, mma_gemv's arithmetic: against mma.sync's conv epilogue and the GEMV then
# causal_conv, outputs and pool), the register cap; (2) tg64 @ d512 at 64 streams: the default, the conv in the
# epilogue (predicted: the 30 conv launches' ~0.25 ms of a ~12.4 ms step, +2%), the MoE's 8-row tiles with 5 and 8
# shared-memory slots (DELTASERVE_MOE_WGMMA_STAGES=5@8 / 8@8: ncu found the gated form at 2.9 TB/s with two groups in
# flight a program; predicted gated 93 -> ~70 us a layer if bytes in flight are its bound, +7%); (3) records at this
# commit's defaults (the row split and the 8-row cap, 5b1d4bb, have an A/B and no records yet).  ~400 s
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_next.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg
TESTS_NAMED=1 gpu_tests 120 tests/gpu/test_wgmma_experts_gpu.py -k "through_wg_gemv or register_cap"
for cfg in "" "DELTASERVE_WG_GEMV_CONV=epilogue" "DELTASERVE_MOE_WGMMA_STAGES=5@8" "DELTASERVE_MOE_WGMMA_STAGES=8@8" ""; do
  bench_tg "${cfg:-default}" 64 64 $cfg
done
M="--preset qwen3.6-35b-a3b --quant q4"
timeout 170 python3 -m deltaserve bench $M -p 512 -n 128 -d 512 -b 64,8 -r 3 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b64.log"; grep -E "^\| deltaserve" "$OUT/bench_b64.log" | sort -u
timeout 100 python3 -m deltaserve bench $M -p 512 -n 128 -d 0,512,4096,8192,32768 -b 1 -r 5 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b1.log"; grep -E "^\| deltaserve" "$OUT/bench_b1.log" | sort -u
tar czf "$OUT/tcache.tgz" -C /tmp tcache && split -b 15M "$OUT/tcache.tgz" "$OUT/tcache.tgz." && rm "$OUT/tcache.tgz"
echo "done ($((SECONDS-t0)) s)"

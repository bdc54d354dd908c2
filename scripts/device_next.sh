#!/usr/bin/env bash
# Device call: (1) GPU tests of the wgmma kernels' whole file: the prepared forms (wg_gemv's conv in its epilogue,
# DELTASERVE_WG_GEMV_CONV=epilogue, mma_gemv's arithmetic: against mma.sync's conv epilogue and the GEMV then
# causal_conv, outputs and pool; the register cap) and the refactors not yet run on the GPU (the PDL wrappers, the
# conv parameters, _moe_35b_case); (2) tg64 @ d512 at 64 streams: the default, the conv in the epilogue (predicted:
# the 30 conv launches' ~0.25 ms of a ~12.4 ms step, +2%), the MoE's 8-row tiles with 5 and 8 shared-memory slots
# (DELTASERVE_MOE_WGMMA_STAGES=5@8 / 8@8: ncu found the gated form at 2.9 TB/s with two groups in flight a program;
# predicted gated 93 -> ~70 us a layer if bytes in flight are its bound, +7%), the default again (drift). The Triton
# cache goes back in $OUT for the next call. Records follow in scripts/device_records.sh.  ~550 s from a cold cache
# Usage (H200 machine, repo root): bash scripts/device_next.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg
TESTS_NAMED=1 gpu_tests 170 tests/gpu/test_wgmma_experts_gpu.py
BENCH_TIMEOUT=170 bench_tg default 64 64
for cfg in "DELTASERVE_WG_GEMV_CONV=epilogue" "DELTASERVE_MOE_WGMMA_STAGES=5@8" "DELTASERVE_MOE_WGMMA_STAGES=8@8" ""; do
  bench_tg "${cfg:-default}" 64 64 $cfg
done
tar czf "$OUT/tcache.tgz" -C /tmp tcache && split -b 15M "$OUT/tcache.tgz" "$OUT/tcache.tgz." && rm "$OUT/tcache.tgz"
ls -la "$OUT"
echo "done ($((SECONDS-t0)) s)"

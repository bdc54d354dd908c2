#!/usr/bin/env bash
# Device call: (1) the decode GEMV modes at today's defaults, head (the default) against mma (every q4 decode linear on
# the tensor-core GEMV), tg64 @ d512 at B = 1, 2, 4, 8, 64 in one process each: where mma starts to win decides the
# deployment size from which an engine takes it; (2) the prepared wgmma gated-order call (scripts/device_wgmma_order.sh:
# its GPU tests, then pp512 B=1 / B=8 each order); the Triton cache back as $OUT/tcache.tgz.  ~520 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_pp
for mode in head mma; do
  DELTASERVE_DECODE_GEMV=$mode timeout 150 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 \
    -n 64 -d 512 -b 1,2,4,8,64 -r 3 --no-record > "$OUT/modes_$mode.log" 2>&1
  echo "== $mode ($((SECONDS-t0)) s)"; grep -E '^\| deltaserve.*tg' "$OUT/modes_$mode.log" | cut -c1-130
  grep -E "Error|error" "$OUT/modes_$mode.log" | tail -3
done
tar czf "$OUT/tcache.tgz" -C /tmp tcache
TESTS_NAMED=1 gpu_tests 110 tests/gpu/test_wgmma_experts_gpu.py
for order in group partial; do bench_pp "order $order" 1 DELTASERVE_WGMMA_ORDER=$order; done
for order in group partial; do bench_pp "order $order" 8 DELTASERVE_WGMMA_ORDER=$order; done
tar czf "$OUT/tcache.tgz" -C /tmp tcache
echo "done ($((SECONDS-t0)) s)"

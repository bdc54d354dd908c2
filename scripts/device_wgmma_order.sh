#!/usr/bin/env bash
# Device call (prepared, not yet run): the warpgroup-MMA experts kernel taking the gated form's groups partial sum
# by partial sum (DELTASERVE_WGMMA_ORDER=partial: each partial sum adds its groups in the same order, so the same
# bits; sm_90 at 16-row tiles 255 -> 165 registers, 3 programs an SM instead of 2). (1) its GPU tests (both orders
# against mma.sync, every tile width and slot count); (2) the probe at 512 / 4096 tokens, both orders, 8- and
# 16-row tiles; (3) pp512 B=1 and B=8 with each order.  ~300 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_pp
TESTS_NAMED=1 gpu_tests 120 tests/gpu/test_wgmma_experts_gpu.py
timeout 120 python3 scripts/probe_wgmma_experts.py --t 512,4096 --bn 8,16 --ns 3 --orders group,partial \
  --out "$OUT/probe.jsonl" > "$OUT/probe.log" 2>&1
echo "== probe ($((SECONDS-t0)) s)"; grep -E "differing|Error|error" "$OUT/probe.log" | cut -c1-160; grep -E "^\|" "$OUT/probe.log"
for order in group partial; do bench_pp "order $order" 1 DELTASERVE_WGMMA_ORDER=$order; done
for order in group partial; do bench_pp "order $order" 8 DELTASERVE_WGMMA_ORDER=$order; done
echo "done ($((SECONDS-t0)) s)"

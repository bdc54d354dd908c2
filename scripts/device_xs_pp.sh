#!/usr/bin/env bash
# Device call (prepared, not yet run; after scripts/device_xs.sh on a warm machine, or alone): pp512 @ d0 at 1 and 8
# prompts, alternating the default, the staged group sums (DELTASERVE_WGMMA_XS=smem: the prefill MoE's 16-row gated
# form 165 -> 150 registers, a step 232 -> 205 instructions; predicted pp512 +3-5%) and the staged sums with carried
# slots; the 8-prompt pp512 that fell to 22,971 +-1,186 in the 77a5542 records on an unchanged path is measured three
# times at the default, to see whether that was the machine (28,344 +-163 at 120018d).  ~330 s
# Usage (H200 machine, repo root): bash scripts/device_xs_pp.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, bench_pp
for b in 8 1; do
  for cfg in "" "DELTASERVE_WGMMA_XS=smem" "DELTASERVE_WGMMA_XS=smem DELTASERVE_WGMMA_SLOTS=carry" ""; do
    bench_pp "${cfg:-default}" $b $cfg
  done
done
bench_pp default 8
echo "done ($((SECONDS-t0)) s)"

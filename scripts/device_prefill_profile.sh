#!/usr/bin/env bash
# Device call (prepared, not yet run): where pp512 spends its GPU time now, for the prefill target (28,000 tok/s:
# ~18 ms per 512 tokens; the default path runs 10,205, the tensor-core MoE 15,620, i.e. ~50 / ~33 ms). One eager
# prefill of 512 tokens profiled (`bench --profile-prefill`: kernels by GPU time, host vs GPU) for the default MoE
# and the tensor-core one. No records.  ~150 s
# Usage (H200 machine, repo root): bash scripts/device_prefill_profile.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
for moe in cuda mma; do
  DELTASERVE_MOE=$moe timeout 150 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 0 \
    -b 1 -r 3 --no-record --profile-prefill > "$OUT/prefill_$moe.log" 2>&1
  echo "== MoE $moe ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve" "$OUT/prefill_$moe.log" | sort -u
  grep -A24 "# prefill profile" "$OUT/prefill_$moe.log" | cut -c1-130
done

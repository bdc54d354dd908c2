#!/usr/bin/env bash
# Device call (wave 38): three prefill changes, bits first. (1) the prefill's bf16 copies of the weights the fused
# dense kernel never serves (fast.prefill_bf16_weight: the 35B-A3B's out projections, 640 MiB), predicted pp512 B=1
# +1.7% (40 x 8.9 us of dequantisation gone); (2) the prefill conv's blocks past the first without the state's loads,
# its weight taps-major (16-byte loads), predicted 15.4 -> ~10 us a layer (+0.8%); (3) the dense kernel's bf16-fma
# form without the unused (s, b) copies (840 SASS against 872), predicted ~-1 us a launch. GPU tests, then pp512 B=1
# with the copies off / on (ABAB), the prefill graph's profile, the conv and dense probes. ~500 s.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_wave38.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_wgmma_dense_gpu.py tests/gpu/test_kernels_gpu.py -k "dense or bf16 or conv"
for rep in 1 2; do
  bench_pp "copies off" 1 DELTASERVE_PREFILL_BF16_MIB=0
  bench_pp "copies on" 1
done
prefill_profile 16
timeout 60 python3 scripts/probe_prefill_conv.py --t 512,4096 --out "$OUT/probe_conv.jsonl" > "$OUT/probe_conv.log" 2>&1
tail -8 "$OUT/probe_conv.log"
timeout 90 python3 scripts/probe_dense_prefill.py --ms 512 --skip-tiles --fused "128,3,1,1;128,3,1,0" \
  --out "$OUT/probe_dense.jsonl" > "$OUT/probe_dense.log" 2>&1
grep -E "M512|rror" "$OUT/probe_dense.log" | cut -c1-120 | head -20
logs_into_one
rm -f "$OUT/pp.log"
echo "done ($((SECONDS-t0)) s)"

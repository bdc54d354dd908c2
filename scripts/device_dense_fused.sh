#!/usr/bin/env bash
# Device call: the dense prefill projections through one warpgroup-MMA matmul that dequantises the q4 weight in
# registers (kernels/quant/wgmma_dense.py, DELTASERVE_PREFILL_DENSE=fused) instead of dequantise (~20 us for the
# in_proj) then dense_mm (46 us). First the bits (GPU tests: == dequantize + dense_mm at the 35B-A3B's shapes for
# every launch shape, poisoned outputs; the tiny q4 model's prefill logits fused == dequant), then the probe per
# launch shape at 512 / 4,096 rows (predicted: in_proj 66 -> ~40 us at 512), then pp512 B=1 and 8 prompts each way
# (predicted B=1 +5%, 8 prompts +4%), then the prefill graph's profile under fused. ~350 s. Second form (v2):
# x by TMA, the bf16x2-fma dequantisation where exact, a group's MMAs awaited before the next is dequantised.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_dense_fused.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_wgmma_dense_gpu.py
timeout 150 python3 scripts/probe_dense_prefill.py --ms 512,4096 --skip-tiles --out "$OUT/probe.jsonl" \
  > "$OUT/probe.log" 2>&1; grep -vE "^\s*$" "$OUT/probe.log" | grep -E "M512|M4096|rror" | cut -c1-120 | head -40
for rep in 1 2; do
  bench_pp "dequant" 1 DELTASERVE_PREFILL_DENSE=dequant
  bench_pp "fused" 1 DELTASERVE_PREFILL_DENSE=fused
done
bench_pp "dequant" 8 DELTASERVE_PREFILL_DENSE=dequant
bench_pp "fused" 8 DELTASERVE_PREFILL_DENSE=fused
DELTASERVE_PREFILL_DENSE=fused timeout 100 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 \
  -n 0 -d 0 -b 1 -r 1 --no-record --profile-prefill-graph --profile-top 12 > "$OUT/prefill_graph.log" 2>&1
echo "== profile ($((SECONDS-t0)) s)"; grep -A30 "# prefill graph profile" "$OUT/prefill_graph.log" | cut -c1-130
logs_into_one
rm -f "$OUT/pp.log"
echo "done ($((SECONDS-t0)) s)"

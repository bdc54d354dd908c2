#!/usr/bin/env bash
# Device call, the wave's last: GPU tests of the fused dense prefill matmul at its defaults (its bits against
# dequantise + multiply at every launch shape, the tiny q4 model's prefill fused == dequant, the engine's prefill
# graphs == eager with every prefill projection on it), the prefill attention's tile knob (bits), a pp512 B=1 A/B
# of the new default against dequant and of two untried launch options (the attention at 32-row tiles, the fused
# matmul capped at 128 registers: 4 programs an SM), then the records at this tree. Predicted: pp512 B=1 +2.7%
# (in_proj -14 us, q|k|v -11 us a layer in the call-2 graph profile; the out projections stay on dequant), 8 and 64
# prompts and every decode unchanged (4,096-row chunks keep dequant). ~560 s.
# Run once at e895148; the attention tile knob it A/Bs was removed after (its smaller tiles change bits).
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): DELTASERVE_COMMIT=<sha> bash scripts/device_records37.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 120 tests/gpu/test_wgmma_dense_gpu.py tests/gpu/test_kernels_gpu.py -k "dense or attention_tile"
DELTASERVE_PREFILL_DEQUANT_MIN=1 DELTASERVE_WG_DENSE_MIN_PROGRAMS=1 gpu_tests 45 tests/gpu/test_engine_graph_gpu.py \
  -k prefill_graph
bench_pp "default (fused)" 1
bench_pp "dequant" 1 DELTASERVE_PREFILL_DENSE=dequant
bench_pp "default (fused)" 1
bench_pp "dequant" 1 DELTASERVE_PREFILL_DENSE=dequant
bench_pp "attention 32,4" 1 DELTASERVE_PREFILL_ATTN_TILE=32,4
bench_pp "fused cap 128" 1 DELTASERVE_WG_DENSE_MAXNREG=128
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 165 115
logs_into_one
rm -f "$OUT/pp.log"
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the prefill's router logits on tensor cores (moe/triton_router_mma, DELTASERVE_PREFILL_ROUTER=mma):
# its GPU tests (the kernel against fp64 at the 35B router, a token's logits the same in every chunk, moe_route's
# prefill routing; the q4 model's tensor-core modes against the CPU reference whole and chunked; the prefill graphs
# == eager), the probe (the Gluon rows kernel against the tensor-core router at 512 and 4,096 tokens, four tile
# shapes), then the in-model A/B, ABAB: pp512 with 1 prompt (predicted +6%: the rows kernel's ~37 us a layer ->
# ~5) and 8 prompts (+9%: ~270 -> ~20 us a layer). ~520 s.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_router_mma.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 170 tests/gpu/test_kernels_gpu.py tests/gpu/test_model_mma_path.py \
  tests/gpu/test_engine_graph_gpu.py -k "router_mma or route_prefill or router_rows or cpu_reference or prefill_graph"
timeout 90 python3 scripts/probe_router_rows.py --t 512,4096 --shapes 8,16 --out "$OUT/probe.jsonl" \
  > "$OUT/probe.log" 2>&1; tail -14 "$OUT/probe.log"
PP_TIMEOUT=150 bench_pp "rows" 1 DELTASERVE_PREFILL_ROUTER=rows
bench_pp "mma" 1
bench_pp "rows" 1 DELTASERVE_PREFILL_ROUTER=rows
bench_pp "mma" 1
bench_pp "rows" 8 DELTASERVE_PREFILL_ROUTER=rows
bench_pp "mma" 8
bench_pp "rows" 8 DELTASERVE_PREFILL_ROUTER=rows
bench_pp "mma" 8
# the 64-stream in_proj / q|k|v at 64-row tiles over 4 programs (one partial sum a program, each weight dequantised
# once): the probe only, for the next call's A/B
timeout 80 python3 scripts/probe_wg_gemv.py --ms 64 --bn 32,64 --ns 3 --xs smem --ks 1,2,4 --shapes 0,1 \
  --out "$OUT/probe_wg.jsonl" > "$OUT/probe_wg.log" 2>&1; tail -12 "$OUT/probe_wg.log"
logs_into_one
echo "done ($((SECONDS-t0)) s)"

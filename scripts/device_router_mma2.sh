#!/usr/bin/env bash
# Device call: why the tensor-core prefill router gained +9.6% at 8 prompts but nothing at pp512 B=1 (probe at 512
# tokens: the Gluon rows kernel 37.1 us, this one 20.3): one eager prefill profile each way (bench --profile-prefill:
# kernels by GPU time), the probe at 512 tokens with two groups a loop step and smaller tiles (predicted: two groups
# ~-20%, 32-token tiles ~-30% at 512 tokens), the model-level GPU tests the last call's window cut (the q4 model's
# tensor-core modes against the CPU reference whole and chunked, the prefill graphs == eager), and a second B=1
# A/B pair. ~470 s.  Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_router_mma2.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
for mode in rows mma; do
  DELTASERVE_PREFILL_ROUTER=$mode timeout 100 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 \
    -n 0 -d 0 -b 1 -r 3 --no-record --profile-prefill > "$OUT/prefill_$mode.log" 2>&1
  echo "== $mode ($((SECONDS-t0)) s)"; grep -A34 "# prefill profile" "$OUT/prefill_$mode.log" | grep -v "^  block\|host-blocking" | cut -c1-120
done
# (its "64,32,2" shape, two groups a loop step, was refuted here and the switch removed afterwards)
timeout 80 python3 scripts/probe_router_rows.py --t 512 --shapes 8,16 --mma 64,32 64,32,2 32,32 32,64 16,64 \
  --out "$OUT/probe.jsonl" > "$OUT/probe.log" 2>&1; tail -8 "$OUT/probe.log"
bench_pp "rows" 1 DELTASERVE_PREFILL_ROUTER=rows
bench_pp "mma" 1
bench_pp "rows" 1 DELTASERVE_PREFILL_ROUTER=rows
bench_pp "mma" 1
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_kernels_gpu.py tests/gpu/test_model_mma_path.py \
  tests/gpu/test_engine_graph_gpu.py -k "router_mma or cpu_reference or prefill_graph"
logs_into_one
echo "done ($((SECONDS-t0)) s)"

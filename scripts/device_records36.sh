#!/usr/bin/env bash
# Device call, the wave's last: GPU tests of the new defaults (the prefill conv's tiles and the initial-states
# gather against their references, the tensor-core router at every PDL placement, the q4 model's tensor-core modes
# against the CPU reference whole and in chunks, graphs == eager), the conv / gather probe, a pp512 B=1 A/B of the
# gather (triton, the default, against torch) and of the probe's fastest conv tile, then the records at this tree.
# Predicted: pp512 B=1 +5-9% from the router without PDL and its bf16 codes (call 2: 23,762 -> 25,985 mean), the
# gather +1% (~8 us a DeltaNet layer), 8 prompts +1.5%, 64 prompts ~+1%, every decode unchanged. ~500 s.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): DELTASERVE_COMMIT=<sha> bash scripts/device_records36.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 75 tests/gpu/test_kernels_gpu.py -k "conv_prefill_tiles or initial_states or router_mma or route_prefill"
gpu_tests 80 tests/gpu/test_model_mma_path.py tests/gpu/test_engine_graph_gpu.py -k "q4_mma or prefill_graph"
timeout 60 python3 scripts/probe_prefill_conv.py --t 512,4096 --out "$OUT/probe_conv.jsonl" > "$OUT/probe_conv.log" 2>&1
tail -11 "$OUT/probe_conv.log"
best=$(python3 -c "
import json; r=[json.loads(l) for l in open('$OUT/probe_conv.jsonl') if '\"prefill_conv\"' in l and '\"t\": 512' in l]
r=[x for x in r if x['bit_equal']]; print(min(r, key=lambda x: x['us'])['variant'].split()[1] if r else '16,64')")
echo "fastest conv tile at 512 tokens: $best"
bench_pp "default" 1
bench_pp "gather torch" 1 DELTASERVE_GDN_INITIAL_STATES=torch
bench_pp "conv $best" 1 DELTASERVE_CONV_PREFILL_TILE=$best
bench_pp "default" 1
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 170 125
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

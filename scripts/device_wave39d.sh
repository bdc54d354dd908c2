#!/usr/bin/env bash
# Device call (wave 39, fifth): the prefill graph tests the fourth call's window did not reach (the q4 models' prefill
# graphs == eager at the staged load and the 5-stage prefill attention), then the prefill host probe again with the
# bench's unit taken apart: load + replay, load + synchronize + replay, a sleep as long as the load + replay. The
# fourth call found load + replay 135-880 us over the two timed apart. Predicted: the synchronize form costs what
# the two apart do (the pending copies delay the graph's launch), the sleep form what replay alone does.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_wave39d.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_engine_graph_gpu.py -k "prefill_graph and not bf16"
timeout 150 python3 scripts/probe_prefill_host.py --depths 0,512 --reps 20 > "$OUT/probe_host.log" 2>&1
grep -E "^\||equal" "$OUT/probe_host.log"; grep -E "rror" "$OUT/probe_host.log" | tail -3
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

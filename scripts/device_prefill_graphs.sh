#!/usr/bin/env bash
# Device call: prefill graphs for several prompts (PrefillGraph(batch=B); the bench's pp of B prompts through it):
# their GPU tests (three sequences' chunks through one graph == one eager forward, logits, KV and states bit for
# bit; the engine's prefill graphs), pp512 @ d0 at 8 prompts (graph three times, eager once), 64 and 1, then the
# records at this tree. Prediction: the 8-prompt forward loses its ~155 ms of host time (about its GPU time): 8
# prompts 24-30k -> ~30k with a spread like the 64-prompt run's (+-1%).  ~520 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz):
#   DELTASERVE_COMMIT=<sha> bash scripts/device_prefill_graphs.sh
source "$(dirname "$0")/device_env.sh"
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_engine_graph_gpu.py -k "prefill"
for b in 8 8 64 1 8; do bench_pp "graph" $b; done
timeout 120 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 0 -b 8 -r 3 --no-graph \
  --no-record > "$OUT/pp.log" 2>&1
echo "== eager B=8 ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*pp' "$OUT/pp.log" | sort -u | cut -c50-110)"
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 190 125
logs_into_one
rm -f "$OUT/pp.log"
cache_news
echo "done ($((SECONDS-t0)) s)"

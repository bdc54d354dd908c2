#!/usr/bin/env bash
# Device call: the wave's two changes measured (the first try of scripts/device_router_norm.sh ran without fla: a
# committed link had replaced the carried wheels). (1) The MoE's input norm inside the router launch
# (DELTASERVE_ROUTER_NORM): the q4 model's tensor-core MoE tests (route_normed in use, fused == split logits,
# the CPU reference whole and chunked, batch invariance alone vs among 63 others, graph == eager), then batch 1
# twice each way and 8 streams. Prediction: batch 1 +3% (640 -> ~660), 8 streams +1-2%. (2) Prefill graphs of
# several prompts: their GPU tests, then pp512 @ d0 of 8 prompts by graph twice and eager once, 64 and 1 by graph.
# Prediction: 8 prompts ~30k with a spread of +-1% (the 64-prompt run's), eager 24-30k as before.  ~560 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_w28_ab.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_model_mma_path.py tests/gpu/test_engine_graph_gpu.py \
  -k "(mma-moe and not wgmma) or prefill_graph"
for v in split fused split fused; do bench_tg "router norm $v" 1 64 DELTASERVE_ROUTER_NORM=$v; done
for v in split fused; do bench_tg "router norm $v" 8 64 DELTASERVE_ROUTER_NORM=$v; done
for b in 8 8 64 1; do bench_pp "graph" $b; done
timeout 120 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 0 -b 8 -r 3 --no-graph \
  --no-record > "$OUT/pp.log" 2>&1
echo "== eager B=8 ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*pp' "$OUT/pp.log" | sort -u | cut -c50-110)"
logs_into_one
rm -f "$OUT/pp.log"
cache_news
echo "done ($((SECONDS-t0)) s)"

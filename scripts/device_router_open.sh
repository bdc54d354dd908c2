#!/usr/bin/env bash
# Device call: where the tensor-core prefill router should open its successor. Last call: in the captured prefill
# graph the router ran 54.9 us a layer against 20.2 alone (probe), and launched without PDL pp512 B=1 gained +3.4%
# (24,637 / 24,956 -> 25,501 / 25,749). Hypothesis: opening first thing lets the MoE block's chain of launches
# start (top-k, tiles, the gated experts' 4,360 programs) while the router runs, and they slow it. If so, opening
# after the K loop (DELTASERVE_ROUTER_MMA_PDL=end: the router still starts behind the norm) gives what "off" gave
# plus the router's own launch ramp (~+0.2%). With each: the bf16 codes (last call: probe 20.2 -> 13.9 us at 512
# tokens, 8 prompts +1.5%). Then the prefill graph's profile for end and off (the router's in-graph time), 8
# prompts, and a 64-stream decode graph profile with the routing split into its launches (router, top-k, tiles:
# which part of the fused launch's 19.2 us a layer is the long one). GPU tests of the router first. ~330 s.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_router_open.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 90 tests/gpu/test_kernels_gpu.py -k "router_mma or route_prefill"
for rep in 1 2; do
  bench_pp "words early" 1
  bench_pp "bf16 early" 1 DELTASERVE_ROUTER_MMA_CODES=bf16
  bench_pp "bf16 end" 1 DELTASERVE_ROUTER_MMA_CODES=bf16 DELTASERVE_ROUTER_MMA_PDL=end
  bench_pp "bf16 off" 1 DELTASERVE_ROUTER_MMA_CODES=bf16 DELTASERVE_ROUTER_MMA_PDL=off
  bench_pp "words end" 1 DELTASERVE_ROUTER_MMA_PDL=end
done
for mode in end off; do
  DELTASERVE_ROUTER_MMA_CODES=bf16 DELTASERVE_ROUTER_MMA_PDL=$mode timeout 100 python3 -m deltaserve bench \
    --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 0 -b 1 -r 1 --no-record --profile-prefill-graph --profile-top 80 \
    > "$OUT/prefill_graph_$mode.log" 2>&1
  echo "== bf16 $mode ($((SECONDS-t0)) s)"; grep -A12 "# prefill graph profile" "$OUT/prefill_graph_$mode.log" | cut -c1-120
  grep -E "_router_mma_kernel|_topk_kernel" "$OUT/prefill_graph_$mode.log" | cut -c1-120
done
bench_pp "bf16 early" 8 DELTASERVE_ROUTER_MMA_CODES=bf16
bench_pp "bf16 end" 8 DELTASERVE_ROUTER_MMA_CODES=bf16 DELTASERVE_ROUTER_MMA_PDL=end
bench_pp "bf16 off" 8 DELTASERVE_ROUTER_MMA_CODES=bf16 DELTASERVE_ROUTER_MMA_PDL=off
M="--preset qwen3.6-35b-a3b --quant q4 --no-record"
DELTASERVE_MOE_ROUTE_TILES=split timeout 120 python3 -m deltaserve bench $M -p 16 -n 32 -d 512 -b 64 -r 2 \
  --profile-graph --profile-top 40 > "$OUT/graph64_split.log" 2>&1
echo "== graph profile B=64, routing split ($((SECONDS-t0)) s)"; grep -A36 "decode graph profile" "$OUT/graph64_split.log" | cut -c1-130
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

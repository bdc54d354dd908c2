#!/usr/bin/env bash
# Device call: why the tensor-core prefill router (eager profile: 1.81 -> 0.85 ms a 512-token prefill) moves pp512
# B=1 by nothing (4 pairs: 24,653 -> 24,320 mean) while 8 and 64 prompts gain +9.6% / +7.3%. Hypothesis: with PDL
# its 64 programs open the next launches at once, whose waiting programs then fill the idle SMs (the rows kernel's
# 1,024 programs kept them out). If so, the router launched plainly (DELTASERVE_ROUTER_MMA_PDL=0) recovers the
# ~0.9 ms (+4%). Then the prefill graph's own profile each way (bench --profile-prefill-graph: each kernel's
# in-graph and critical time), which says where the eager -0.95 ms went whatever the A/B says. Last, the router's
# codes read from a bf16 copy (DELTASERVE_ROUTER_MMA_CODES=bf16: no unpacking, store and barrier in the loop; the same
# bits): probe at 512 / 4,096 tokens (predicted 20 -> ~12 us, 55 -> ~35) and 8 prompts (+0.5-1%). ~300 s.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_router_pdl.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
for rep in 1 2; do
  bench_pp "rows" 1 DELTASERVE_PREFILL_ROUTER=rows
  bench_pp "mma" 1
  bench_pp "mma, its PDL off" 1 DELTASERVE_ROUTER_MMA_PDL=0
done
for mode in rows mma; do
  DELTASERVE_PREFILL_ROUTER=$mode timeout 100 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 \
    -n 0 -d 0 -b 1 -r 1 --no-record --profile-prefill-graph > "$OUT/prefill_graph_$mode.log" 2>&1
  echo "== $mode ($((SECONDS-t0)) s)"; grep -A40 "# prefill graph profile" "$OUT/prefill_graph_$mode.log" | cut -c1-130
done
timeout 80 python3 scripts/probe_router_rows.py --t 512,4096 --shapes 8,16 --mma 64,32 64,32,bf16 128,32,bf16 \
  --out "$OUT/probe.jsonl" > "$OUT/probe.log" 2>&1; tail -9 "$OUT/probe.log"
bench_pp "codes words" 8
bench_pp "codes bf16" 8 DELTASERVE_ROUTER_MMA_CODES=bf16
bench_pp "codes words" 8
bench_pp "codes bf16" 8 DELTASERVE_ROUTER_MMA_CODES=bf16
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

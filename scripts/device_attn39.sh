#!/usr/bin/env bash
# Device call (wave 39, second): the prefill attention kernel's launch (num_warps, num_stages, two key blocks a loop
# step; triton_paged.prefill_launch, none of them a bit) probed at the 35B-A3B's shape, then in the model; and the
# batch-1 merge shape 256x16 against 128x32 again, ABAB at 32K and once each at 512. Predicted: the prefill
# attention 40 -> ~30 us a layer with the pair (pp512 B=1 +0.5%); the merge +0.6% at 32K (last call), 0 at 512.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_attn39.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 120 tests/gpu/test_kernels_gpu.py -k "paged_attention"
timeout 150 python3 scripts/probe_prefill_attention.py --contexts 0,512,4096 \
  --launches "8,0,1;8,2,0;8,2,1;8,1,0;8,3,1;8,4,0" --out "$OUT/probe_prefill_attn.jsonl" > "$OUT/probe_attn.log" 2>&1
grep -A40 "^| ctx" "$OUT/probe_attn.log"; grep -E "rror|differ" "$OUT/probe_attn.log" | tail -3
for rep in 1 2; do
  bench_pp "pp base" 1
  bench_pp "pp pair" 1 DELTASERVE_PREFILL_ATTN=8,0,1
done
BENCH_ARGS="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 32768"
for rep in 1 2; do
  bench_tg "32K merge 128x32" 1 64
  bench_tg "32K merge 256x16" 1 64 DELTASERVE_ATTN_MERGE=256x16
done
BENCH_ARGS="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 512"
bench_tg "d512 merge 128x32" 1 64
bench_tg "d512 merge 256x16" 1 64 DELTASERVE_ATTN_MERGE=256x16
logs_into_one
cache_news
rm -f "$OUT/pp.log" "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call (wave 39, third): the prefill attention's K/V copies two or more key blocks ahead. Its sm_90 TTGIR at
# Triton's default 3 stages holds two K/V buffers and waits for all copies (num = 0) at each step's top: the next
# block's copies go out after the PV product, so each 32-key step waits one L2/DRAM latency (the block-table lookup
# takes a stage). num_stages 5 gives three buffers (waits num 3 / 1), 7 four; 225 registers either way (one 8-warp
# program an SM already). Predicted: 48 -> ~30 us a layer at 512 tokens, 84 -> ~50 at context 512, 337 -> ~200 at
# 4096: pp512 B=1 +1% (d0), +2% (d512), +6% (d4096). GPU test (every launch == the default bit for bit), the probe,
# then pp512 in the model ABAB at d0, once each at d512 and d4096.
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_attn39b.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 120 tests/gpu/test_kernels_gpu.py -k "paged_attention"
timeout 150 python3 scripts/probe_prefill_attention.py --contexts 0,512,4096 --launches "8,5,0;8,6,0;8,7,0;8,9,0" \
  --out "$OUT/probe_prefill_attn.jsonl" > "$OUT/probe_attn.log" 2>&1
grep -A40 "^| ctx" "$OUT/probe_attn.log"; grep -E "rror|differ" "$OUT/probe_attn.log" | tail -3
for rep in 1 2; do
  bench_pp "pp base" 1
  bench_pp "pp st5" 1 DELTASERVE_PREFILL_ATTN=8,5,0
  bench_pp "pp st7" 1 DELTASERVE_PREFILL_ATTN=8,7,0
done
for d in 512 4096; do
  for v in "" 8,5,0 8,7,0; do
    env DELTASERVE_PREFILL_ATTN=$v timeout 120 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 \
      -n 0 -d $d -b 1 -r 3 --no-record > "$OUT/pp.log" 2>&1
    echo "== pp d$d ${v:-base} ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*pp' "$OUT/pp.log" | sort -u | cut -c50-110)"
  done
done
logs_into_one
cache_news
rm -f "$OUT/pp.log" "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call for the fp8 K/V cache (kernels/attention/kv_fp8.py): its GPU tests (writers' bytes, attention against
# fp64 over the dequantised cache, the tiny model end to end: top-1 vs the CPU reference, decode batch invariance,
# graph == eager), the decode attention sweep (bf16 / fp8 cache x the merge's launch shape at 512 / 4096 / 32768
# tokens, B = 1 and 8), then the default mode's decode at 512 and 32K tokens of context with the bf16 and the fp8
# cache (records when DELTASERVE_COMMIT is set: the fp8 ones under quant "q4g64-kvfp8").  ~500 s
# Usage (H200 machine, repo root): [DELTASERVE_COMMIT=<sha>] bash scripts/device_kv_fp8.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
timeout 170 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_kv_fp8_gpu.py \
  "tests/gpu/test_kernels_gpu.py::test_paged_attention" > "$OUT/tests.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
grep -E "^FAILED|^E  " "$OUT/tests.log" | head -8
timeout 100 python3 scripts/sweep_decode_attention.py --budget-s 80 --out "$OUT/sweep_attn.jsonl" \
  > "$OUT/sweep_attn.log" 2>&1
echo "== decode attention sweep ($((SECONDS-t0)) s)"; grep -E "bsp" "$OUT/sweep_attn.log" | cut -c12-140
M="--preset qwen3.6-35b-a3b --quant q4"
REC=$([ -n "${DELTASERVE_COMMIT:-}" ] && echo "--results $OUT" || echo "--no-record")
for KV in auto fp8; do
  timeout 100 python3 -m deltaserve bench $M -p 16 -n 128 -d 512,32768 -b 1 -r 3 --kv-cache-dtype $KV $REC \
    > "$OUT/bench_$KV.log" 2>&1
  echo "== kv $KV ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve.*tg" "$OUT/bench_$KV.log" | sort -u
done

#!/usr/bin/env bash
# Device call for the decode attention's defaults (triton_paged's launch knobs): the attention GPU tests, the split x
# merge sweep around them (batch 1 at 32K and 512 tokens; the split kernel alone too), the default mode's records at
# this commit (tg128 @ d512 and d32768, batch 1, bf16 and fp8 caches; batch 8 and 64 @ d512), and in-model A/Bs
# with the bf16 cache against earlier launch shapes, no records: the original one (splits of 128, merge 32 x 64,
# Triton's 3 stages) and 8dfacf8's (splits of 128 in steps of 32 at 2 stages, merge 128 x 32).  ~480 s
# Usage (H200 machine, repo root): [DELTASERVE_COMMIT=<sha>] bash scripts/device_attn_defaults.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
timeout 150 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_kv_fp8_gpu.py tests/gpu/test_kernels_gpu.py \
  -k "decode_attention or paged_attention or attention_decode_fused or kv_fp8" > "$OUT/tests.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
grep -E "^FAILED|^E  " "$OUT/tests.log" | head -8
timeout 110 python3 scripts/sweep_decode_attention.py --depths 32768,512 --bs 1 --budget-s 90 \
  --out "$OUT/sweep_attn.jsonl" > "$OUT/sweep_attn.log" 2>&1
echo "== decode attention sweep ($((SECONDS-t0)) s):"
grep -E "B=1 d=32768|B=1 d=512 " "$OUT/sweep_attn.log" | cut -c12-150
grep -E "records" "$OUT/sweep_attn.log"
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -n 128"
REC=$([ -n "${DELTASERVE_COMMIT:-}" ] && echo "--results $OUT" || echo "--no-record")
for KV in auto fp8; do
  timeout 110 python3 -m deltaserve bench $M -d 512,32768 -b 1 -r 3 --kv-cache-dtype $KV $REC > "$OUT/bench_$KV.log" 2>&1
  echo "== kv $KV, this commit ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve.*tg" "$OUT/bench_$KV.log" | sort -u
done
S128="--set SPLIT_TOKENS=128 --set DECODE_BN=32"
for AB in "original:$S128 --set MERGE_BSP=32 --set MERGE_BD=64 --set DECODE_STAGES={}" \
          "8dfacf8:$S128 --set DECODE_STAGES={'bf16':2,'fp8':1}"; do
  timeout 60 python3 scripts/bench_attention_pick.py ${AB#*:} -- $M -d 512,32768 -b 1 -r 3 --no-record \
    > "$OUT/bench_${AB%%:*}.log" 2>&1
  echo "== kv auto, the ${AB%%:*} launch shape ($((SECONDS-t0)) s)"
  grep -E "^\| deltaserve.*tg" "$OUT/bench_${AB%%:*}.log" | sort -u
done
timeout 100 python3 -m deltaserve bench $M -d 512 -b 8,64 -r 3 $REC > "$OUT/bench_batch.log" 2>&1
echo "== batch 8, 64 ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve.*tg" "$OUT/bench_batch.log" | sort -u

#!/usr/bin/env bash
# Device call (prepared, not yet run): split programs that loop over their row's splits (triton_paged
# DECODE_PROGRAMS: P programs per (row, KV head) aiming at a launch-wide target, each running splits p, p + P, ...,
# so Triton can request the next split's K/V while this one computes; the same bits by construction and by test),
# and the fp8 split program at 8 warps. GPU tests (strided == one program per split over bf16 and fp8 caches,
# fp8 attention at 8 warps), the sweep (scripts/sweep_decode_attention.py SHAPES: B = 1 and 8, 32K and 512 tokens),
# then tg128 B=1 @ d512 and d32768 in the model: the default, the sweep's pick per cache kind, and fp8 at 8 warps
# (no records: the defaults change only after the A/B).  ~450 s
# Usage (H200 machine, repo root): bash scripts/device_attn_strided.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
source "$(dirname "$0")/device_attn_ab.sh"  # attn_default_vs_pick
timeout 150 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_kernels_gpu.py tests/gpu/test_kv_fp8_gpu.py \
  -k "strided or test_attention or decode_attention_gate" > "$OUT/tests.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
grep -E "^FAILED|^E  " "$OUT/tests.log" | head -8
timeout 150 python3 scripts/sweep_decode_attention.py --depths 32768,512 --bs 1,8 --budget-s 120 \
  --out "$OUT/sweep_attn.jsonl" > "$OUT/sweep_attn.log" 2>&1
echo "== decode attention sweep ($((SECONDS-t0)) s), B=1:"
grep -E "B=1 d=" "$OUT/sweep_attn.log" | cut -c12-160; grep records "$OUT/sweep_attn.log"
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -n 128 -d 512,32768 -b 1 -r 3 --no-record"
attn_default_vs_pick "$OUT/sweep_attn.jsonl" 90 45 $M
timeout 45 python3 scripts/bench_attention_pick.py --set "DECODE_WARPS={'bf16':4,'fp8':8}" -- $M --kv-cache-dtype fp8 \
  > "$OUT/bench_fp8_w8.log" 2>&1
echo "== kv fp8, 8 warps ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve.*tg" "$OUT/bench_fp8_w8.log" | sort -u

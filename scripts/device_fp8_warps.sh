#!/usr/bin/env bash
# Device call (short): the fp8 cache's split program at 8 warps against the default 4, in the model. The fp8
# attention GPU test at 8 warps (fp64 over the dequantised cache, alone == in batch), then tg128 B=1 @ d512 and
# d32768 with the fp8 cache at this commit's default (records when DELTASERVE_COMMIT is set) and at 8 warps (no
# record).  ~130 s
# Usage (H200 machine, repo root): [DELTASERVE_COMMIT=<sha>] bash scripts/device_fp8_warps.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
timeout 40 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_kv_fp8_gpu.py -k test_attention \
  > "$OUT/tests.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -n 128 -d 512,32768 -b 1 -r 3 --kv-cache-dtype fp8"
REC=$([ -n "${DELTASERVE_COMMIT:-}" ] && echo "--results $OUT" || echo "--no-record")
timeout 90 python3 -m deltaserve bench $M $REC > "$OUT/bench_w4.log" 2>&1
echo "== fp8, default (4 warps) ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve.*tg" "$OUT/bench_w4.log" | sort -u
timeout 40 python3 scripts/bench_attention_pick.py --set "DECODE_WARPS={'bf16':4,'fp8':8}" -- $M --no-record \
  > "$OUT/bench_w8.log" 2>&1
echo "== fp8, 8 warps ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve.*tg" "$OUT/bench_w8.log" | sort -u

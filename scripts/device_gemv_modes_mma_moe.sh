#!/usr/bin/env bash
# Device call: with the tensor-core MoE the default, the GEMV modes again (DELTASERVE_DECODE_GEMV head, the default,
# against wide: the >= 8192-row weights on tensor cores, and mma: every decode linear) at B=1 / 8 / 64, the lm_head's
# fp32 logits store at B=1, and where a 64-stream step spends its time (eager --profile).  ~300 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 512"
run() {  # run LABEL B N ENV...
  local label=$1 b=$2 n=$3; shift 3
  env "$@" timeout 90 python3 -m deltaserve bench $M -b "$b" -n "$n" > "$OUT/bench.log" 2>&1
  echo "== $label B=$b ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c50-110)"
}
for rep in 1 2; do
  run "head" 1 128 DELTASERVE_DECODE_GEMV=head
  run "head, logits fp32" 1 128 DELTASERVE_LOGITS_STORE=fp32
  run "wide" 1 128 DELTASERVE_DECODE_GEMV=wide
done
for mode in head wide mma; do run "$mode" 64 32 DELTASERVE_DECODE_GEMV=$mode; done
for mode in head wide; do run "$mode" 8 64 DELTASERVE_DECODE_GEMV=$mode; done
timeout 100 python3 -m deltaserve bench $M -b 64 -n 16 --profile > "$OUT/profile64.log" 2>&1
echo "== B=64 profile ($((SECONDS-t0)) s)"; grep -A24 "decode step profile" "$OUT/profile64.log" | cut -c1-120

#!/usr/bin/env bash
# Device call: with the tensor-core MoE the default, the GEMV modes again (DELTASERVE_DECODE_GEMV head, the default,
# against wide: the >= 8192-row weights on tensor cores, and mma: every decode linear) at B=1 / 8 / 64, the lm_head's
# fp32 logits store at B=1, and where a 64-stream step spends its time (eager --profile).  ~300 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
for rep in 1 2; do
  bench_tg "head" 1 128 DELTASERVE_DECODE_GEMV=head
  bench_tg "head, logits fp32" 1 128 DELTASERVE_LOGITS_STORE=fp32
  bench_tg "wide" 1 128 DELTASERVE_DECODE_GEMV=wide
done
for mode in head wide mma; do bench_tg "$mode" 64 32 DELTASERVE_DECODE_GEMV=$mode; done
for mode in head wide; do bench_tg "$mode" 8 64 DELTASERVE_DECODE_GEMV=$mode; done
timeout 100 python3 -m deltaserve bench $BENCH_ARGS -b 64 -n 16 --profile > "$OUT/profile64.log" 2>&1
echo "== B=64 profile ($((SECONDS-t0)) s)"; grep -A24 "decode step profile" "$OUT/profile64.log" | cut -c1-120

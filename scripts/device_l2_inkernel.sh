#!/usr/bin/env bash
# Wave 42, call 1: per-thread L2 prefetches issued from inside a latency-bound kernel, then the one-row in_proj
# GEMV (scripts/probe_l2_inkernel.py); the full log in $OUT/probe.log, the table last.
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout 400 python3 scripts/probe_l2_inkernel.py --spin-us 8,3 --programs 132,32 "$@" > "$OUT/probe.log" 2>&1
echo "probe rc $? ($((SECONDS-t0)) s)"
grep -v "^|" "$OUT/probe.log" | grep -iE "error|Traceback" | tail -5
sed -n '/^| programs/,$p' "$OUT/probe.log"

#!/usr/bin/env bash
# Wave 42, call 2: (1) the L2 warm probe's replicated touches (each line read by 1 / 2 / 4 carrier programs: does a
# line read from more SMs serve the GEMV as the hot case does?), (2) the graph profiles at the current defaults
# (scripts/device_profiles42.sh).  ~300 s
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 scripts/probe_l2_inkernel.py --spin-us 8 --programs 132,264 --modes none,hot,touch,touch2,touch4,touch32,touch128,touch256 \
  > "$OUT/probe.log" 2>&1
echo "probe rc $? ($((SECONDS-t0)) s)"; grep -iE "error|Traceback" "$OUT/probe.log" | tail -3
sed -n '/^| programs/,$p' "$OUT/probe.log"
bash scripts/device_profiles42.sh

#!/usr/bin/env bash
# Wave 45's first call (~90 s on a warm Triton cache): the two-halves overlap probe (scripts/probe_overlap.py: a
# 64-stream DeltaNet mixer as one chain, as two halves in one stream, and as two halves on two streams, plain,
# staggered and with stream priorities, one in_proj then the halves (after_in, steps); bits checked against the one-chain form first), then the same at 32 rows.
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_overlap.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 scripts/probe_overlap.py > "$OUT/overlap64.log" 2>&1; echo "rc $?"
tail -26 "$OUT/overlap64.log"
timeout 120 python3 scripts/probe_overlap.py --rows 32 > "$OUT/overlap32.log" 2>&1; echo "rc $?"
tail -24 "$OUT/overlap32.log" | head -13
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Prepared for the next wave (~2 min on a warm Triton cache; not yet run): the MoE's expert tiles as two sets on two
# streams (scripts/probe_moe_halves.py: 40 blocks at the 35B-A3B's shapes, 64 tokens, joint / serial / forked;
# the sets' outputs checked bit-equal to the joint launches first), then at 32 tokens.
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_moe_halves.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 scripts/probe_moe_halves.py > "$OUT/moe_halves64.log" 2>&1; echo "rc $?"
tail -8 "$OUT/moe_halves64.log"
timeout 150 python3 scripts/probe_moe_halves.py --tokens 32 > "$OUT/moe_halves32.log" 2>&1; echo "rc $?"
tail -6 "$OUT/moe_halves32.log"
echo "done ($((SECONDS-t0)) s)"

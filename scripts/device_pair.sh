#!/usr/bin/env bash
# Wave 45's ninth call (~2 min on a warm Triton cache): whether the halves' gain is the in-projections' alone: the
# overlap probe's launches-alone table with the 64-row in_proj+conv also as 2 and 4 launches at once, at the
# default tiles and with 16-row tiles at every row count (DELTASERVE_MMA_GEMV_WG_BN=16: one 64-row launch then has
# the pair's program shape).
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_pair.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 scripts/probe_overlap.py > "$OUT/pair.log" 2>&1; echo "rc $?"
grep -E "^\| (joint|forked) |^\| in_proj" "$OUT/pair.log"
DELTASERVE_MMA_GEMV_WG_BN=16 timeout 150 python3 scripts/probe_overlap.py > "$OUT/pair16.log" 2>&1; echo "rc $?"
grep -E "^\| (joint|forked) |^\| in_proj" "$OUT/pair16.log"
echo "done ($((SECONDS-t0)) s)"

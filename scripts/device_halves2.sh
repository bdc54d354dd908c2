#!/usr/bin/env bash
# Wave 45's fifth call (~5 min on a warm Triton cache): the overlap probe with four quarters on four streams
# (forked4); in the model at 32 streams, the mixers' halves from 32 rows (DELTASERVE_MIXER_HALVES=32) against the
# default (from 48: none at 32), twice each; the 64-stream graph profile at the defaults (both mixers' halves).
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_halves2.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 scripts/probe_overlap.py > "$OUT/overlap64.log" 2>&1; echo "rc $?"
grep -E "^\| (joint|forked|after_in)" "$OUT/overlap64.log"
for i in 1 2; do
  bench_tg "halves from 48 (none at 32)" 32 64
  bench_tg "halves from 32" 32 64 DELTASERVE_MIXER_HALVES=32
done
timeout 150 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 --no-record -p 16 -n 32 -d 512 -b 64 -r 2 \
  --profile-graph --profile-top 16 > "$OUT/profile64.log" 2>&1
echo "== graph profile B=64 ($((SECONDS-t0)) s)"; grep -A30 "decode graph profile" "$OUT/profile64.log" | cut -c1-150
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the eager prefill forward's host time (~140 ms a forward whatever its tokens, bench/NOTES.md) under
# cProfile, at 1 and 8 prompts of 512 tokens. Prediction: most of it is Python on the launch path of the ~900 Triton
# launches (our wrappers' checks and Triton's own binding), fla's chunk rule ~1.3 ms a layer.  ~150 s warm
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_host_prefill.sh
source "$(dirname "$0")/device_env.sh"
for b in 1 8; do
  timeout 200 python3 scripts/probe_host_prefill.py $b 512 "$OUT/host_pp$b" > "$OUT/host_pp$b.log" 2>&1
  echo "== B=$b ($((SECONDS-t0)) s)"; grep -v Warn "$OUT/host_pp$b.log" | head -45 | cut -c1-160
done
cache_news
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the router rows probe again with its timings from CUDA graphs (the first call's eager timings were
# the host's: ~330 us a call whatever the shape, with an environment patch in every call), the host's time a launch
# beside them; then the batch-1 prefill profile at the new defaults (where the router and the tiles stand now).
# Prediction: Gluon rows ~25-35 us at 512 tokens (the in-model router-only A/B: +4.0%, ~1 ms over 40 layers from
# 66 us a layer), Triton rows ~66; the parallel tiles ~8 us against ~22.  ~150 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_router_probe31.sh
source "$(dirname "$0")/device_env.sh"
timeout 120 python3 scripts/probe_router_rows.py --t 512,4096 --shapes 4,16 8,16 8,8 4,8 4,32 16,4 \
  --out "$OUT/probe-router-rows.jsonl" > "$OUT/probe.log" 2>&1; echo "probe rc $?"; tail -18 "$OUT/probe.log"
timeout 150 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 0 -b 1 -r 2 \
  --profile-prefill > "$OUT/pp_prof1.log" 2>&1; echo "profile rc $?"
grep -iE "router|tiles|experts|_gemv|dense|total|host|gpu" "$OUT/pp_prof1.log" | head -40
cache_news
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the 4-warp K split over two programs (the in_proj and q|k|v; probe -10% / -18% at 64 rows, in the
# model -1% with the in_proj's conv at the split's last arrival) with that conv as its own launch
# (DELTASERVE_WG_GEMV_CONV=launch), at 64 streams, ABA: predicted, if the conv at the last arrival was the loss,
# +1% over the default 1,8. ~100 s.  Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_inproj_split.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
BENCH_TIMEOUT=60 bench_tg "default 1,8" 64 64
bench_tg "2,8, conv launched" 64 64 DELTASERVE_WG_GEMV_KSPLIT=2,8 DELTASERVE_WG_GEMV_CONV=launch
bench_tg "2,8, conv in the epilogue" 64 64 DELTASERVE_WG_GEMV_KSPLIT=2,8
bench_tg "default 1,8" 64 64
rm -f "$OUT/bench.log"
echo "done ($((SECONDS-t0)) s)"

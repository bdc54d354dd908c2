#!/usr/bin/env bash
# Device call (prepared, not yet run): why the wide GEMVs (DELTASERVE_DECODE_GEMV=wide: the >= 8192-row weights on
# the tensor-core GEMV; +60% at 64 streams, +34% at 8) lose 2.8% at batch 1 under the tensor-core MoE default. The
# kernels after them lose what the GEMVs gain (graph profile of 2026-12-01); suspects: the DeltaNet step's early
# state loads competing with the GEMV ring's loads (DELTASERVE_GDN_STATE_EARLY=0), the ring's registers
# (DELTASERVE_MMA_GEMV_AHEAD=1: no ring). tg128 @ d512 B=1 twice each, then the graph profiles of head and wide.
# ~330 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, bench_tg
for rep in 1 2; do
  bench_tg "head" 1 128 DELTASERVE_DECODE_GEMV=head
  bench_tg "wide" 1 128 DELTASERVE_DECODE_GEMV=wide
  bench_tg "head, state late" 1 128 DELTASERVE_DECODE_GEMV=head DELTASERVE_GDN_STATE_EARLY=0
  bench_tg "wide, state late" 1 128 DELTASERVE_DECODE_GEMV=wide DELTASERVE_GDN_STATE_EARLY=0
  bench_tg "wide, no ring" 1 128 DELTASERVE_DECODE_GEMV=wide DELTASERVE_MMA_GEMV_AHEAD=1
done
for mode in head wide; do
  DELTASERVE_DECODE_GEMV=$mode timeout 120 python3 -m deltaserve bench $BENCH_ARGS -b 1 -n 32 --profile-graph \
    > "$OUT/graph_$mode.log" 2>&1
  echo "== graph profile $mode ($((SECONDS-t0)) s)"; grep -A30 "decode graph profile" "$OUT/graph_$mode.log" | cut -c1-140
done

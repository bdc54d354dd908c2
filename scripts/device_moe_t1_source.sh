#!/usr/bin/env bash
# Device call: which instructions the one-token tensor-core experts kernels stall on (Nsight Compute's per-SASS
# warp-stall samples, scripts/probe_moe_t1.py): gate/up at the default (W4 AHEAD2), with every chunk in flight
# (AHEAD 8) and at W 8, and down; each source page as CSV under $OUT for reading here.  ~150 s
# Usage (H200 machine, repo root): bash scripts/device_moe_t1_source.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
run() {  # name, probe args
  local name=$1; shift
  timeout 60 "$NCU" --clock-control none -k regex:_mma_experts --launch-skip 3 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis \
    -o /tmp/$name --force-overwrite python3 scripts/probe_moe_t1.py "$@" > "/tmp/$name.log" 2>&1
  "$NCU" -i /tmp/$name.ncu-rep --page source --print-source sass --csv > "$OUT/src_$name.csv" 2>/dev/null
  "$NCU" -i /tmp/$name.ncu-rep --page details > "$OUT/det_$name.txt" 2>/dev/null
  echo "== $name ($((SECONDS-t0)) s): $(grep -E "per call|rror" "/tmp/$name.log" | head -1)"
  grep -E "Duration  |DRAM Throughput|L2 Hit Rate|Mem Busy|Max Bandwidth|Warp Cycles Per Issued" "$OUT/det_$name.txt" | sed -E 's/ {2,}/ /g' | head -8
}
run gated_a2 --only gated
run gated_a8 --only gated --gated-config 4,1,8,1
run gated_w8 --only gated --gated-config 8,1,2,1
run scaled --only scaled
ls -la "$OUT"

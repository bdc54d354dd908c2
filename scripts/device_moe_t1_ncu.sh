#!/usr/bin/env bash
# Device call: where the decode MoE's one-token time goes. (1) Nsight Compute over the tensor-core experts kernels
# (gated gate/up, scaled down) and the CUDA-core gate/up and down at T = 1, experts read from DRAM
# (scripts/probe_moe_t1.py): duration, DRAM, occupancy, warp stall reasons. (2) If Nsight Systems is there, the
# B=1 decode step of the model in its CUDA graph, default MoE and DELTASERVE_MOE=mma, per-kernel GPU time with PDL
# overlap (what the eager profile cannot show; the H200 image has no nsys, so this part was skipped when it ran).
# (3) The Triton cache, packed, for the next call.  ~50 s with no nsys
# Usage (H200 machine, repo root): bash scripts/device_moe_t1_ncu.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
echo "triton cache carried: $(ls /tmp/tcache 2>/dev/null | wc -l) entries"
python3 scripts/probe_moe_t1.py > "$OUT/probe.log" 2>&1; cat "$OUT/probe.log" | tail -4
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
S="smsp__average_warps_issue_stalled"
M="${S}_long_scoreboard_per_issue_active.ratio,${S}_barrier_per_issue_active.ratio,${S}_short_scoreboard_per_issue_active.ratio,${S}_wait_per_issue_active.ratio,${S}_mio_throttle_per_issue_active.ratio,${S}_math_pipe_throttle_per_issue_active.ratio,${S}_lg_throttle_per_issue_active.ratio,${S}_not_selected_per_issue_active.ratio,${S}_selected_per_issue_active.ratio,${S}_no_instruction_per_issue_active.ratio,${S}_dispatch_stall_per_issue_active.ratio,${S}_membar_per_issue_active.ratio,${S}_drain_per_issue_active.ratio,${S}_imc_miss_per_issue_active.ratio,${S}_branch_resolving_per_issue_active.ratio,${S}_sleeping_per_issue_active.ratio"
K='regex:_mma_experts|_gate_up_kernel|_down_kernel'
timeout 100 "$NCU" --clock-control none -k "$K" --launch-count 40 --print-summary per-kernel --section SpeedOfLight \
  --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --metrics "$M" \
  python3 scripts/probe_moe_t1.py > "$OUT/ncu.txt" 2>&1
echo "== ncu at T=1 ($((SECONDS-t0)) s)"
grep -E "^  [_a-zA-Z].*\(|Duration  |DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|Waves Per SM|Grid Size|Block Size|Issued Warp Per|No Eligible|Executed Ipc A" \
  "$OUT/ncu.txt" | sed -E 's/ {2,}/ /g' | head -120
grep -E "^  [_a-zA-Z].*\(|stalled" "$OUT/ncu.txt" | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/ {2,}/ /g' | awk '$NF+0 >= 0.3 || /\(/' | head -80
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}"
if [ -n "$NSYS" ]; then
  B="-m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 -n 64 -r 1 --no-record -d 512 -b 1"
  for mode in cuda mma; do
    DELTASERVE_MOE=$mode timeout 150 "$NSYS" profile -o /tmp/nsys_$mode --force-overwrite true --trace cuda \
      --cuda-graph-trace node python3 $B > "$OUT/nsys_$mode.log" 2>&1
    "$NSYS" stats --report cuda_gpu_kern_sum --format csv -o "$OUT/kern_$mode" /tmp/nsys_$mode.nsys-rep >/dev/null 2>&1
    echo "== nsys MoE $mode ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/nsys_$mode.log" | head -1)"
    python3 - "$OUT/kern_${mode}_cuda_gpu_kern_sum.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tot = sum(float(r["Total Time (ns)"]) for r in rows)
for r in sorted(rows, key=lambda r: -float(r["Total Time (ns)"]))[:22]:
    print(f'{float(r["Total Time (ns)"]) / tot * 100:5.1f}% {int(r["Instances"]):7d} x {float(r["Avg (ns)"]) / 1e3:7.2f} us  {r["Name"][:90]}')
PY
  done
fi
tar czf "$OUT/tcache.tgz" -C /tmp tcache && echo "triton cache packed: $(du -h "$OUT/tcache.tgz" | cut -f1)"

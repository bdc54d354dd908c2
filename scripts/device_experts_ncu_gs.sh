#!/usr/bin/env bash
# Device call (prepared, not yet run): what binds the 64-stream MoE now that its 8-row steps take two groups (13%
# fewer instructions a group bought ~3% of its time, bench/NOTES.md): Nsight Compute over the gated and down launches
# at 64 tokens with the model's slots, one group a step against two: duration, DRAM, occupancy, instructions, stall
# reasons. Prediction: long-scoreboard / barrier stalls dominate at both, and DRAM stays near 60%.  ~150 s
# Usage (H200 machine, repo root; carry .whl and .tcache.txz): bash scripts/device_experts_ncu_gs.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
S="smsp__average_warps_issue_stalled"
M="${S}_long_scoreboard_per_issue_active.ratio,${S}_barrier_per_issue_active.ratio,${S}_short_scoreboard_per_issue_active.ratio,${S}_wait_per_issue_active.ratio,${S}_mio_throttle_per_issue_active.ratio,${S}_math_pipe_throttle_per_issue_active.ratio,${S}_lg_throttle_per_issue_active.ratio,${S}_not_selected_per_issue_active.ratio,${S}_selected_per_issue_active.ratio,${S}_no_instruction_per_issue_active.ratio,${S}_membar_per_issue_active.ratio,${S}_dispatch_stall_per_issue_active.ratio,dram__bytes_read.sum,sm__inst_executed.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
for gs in 1 2; do
  DELTASERVE_MOE_WGMMA_GROUPS=$gs timeout 100 "$NCU" --clock-control none -k 'regex:_wg_experts_kernel' --launch-skip 2 \
    --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --metrics "$M" python3 scripts/ncu_wg_kernels.py --experts-only > "$OUT/ncu_gs$gs.txt" 2>&1
  echo "== groups $gs ($((SECONDS-t0)) s)"
  grep -E "^  [_a-zA-Z].*\(|measured launch|Duration  |DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|inst_executed|tensor_cycles|dram__bytes" \
    "$OUT/ncu_gs$gs.txt" | sed -E 's/ {2,}/ /g' | head -40
  grep -E "stalled" "$OUT/ncu_gs$gs.txt" | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/ {2,}/ /g' \
    | awk '$NF+0 >= 0.25' | head -30
done
echo "done ($((SECONDS-t0)) s)"

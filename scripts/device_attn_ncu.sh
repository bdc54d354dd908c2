#!/usr/bin/env bash
# Device call (short): where c16863d's decode attention spends its time at 32K tokens, batch 1. Nsight Compute over
# the split and merge kernels, bf16 and fp8 caches (scripts/probe_decode_attention.py): occupancy, DRAM, launch
# stats, then the split kernel's warp stall reasons; and a small sweep of launch shapes the last ones left untried
# (8 warps, merge columns 16, splits of 32).  ~190 s
# Usage (H200 machine, repo root): bash scripts/device_attn_ncu.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 60 "$NCU" --clock-control none -k regex:_decode_ --launch-skip 2 --launch-count 6 --section SpeedOfLight \
  --section Occupancy --section LaunchStats --section WarpStateStats \
  python3 scripts/probe_decode_attention.py --depth 32768 > "$OUT/ncu.txt" 2>&1
echo "== ncu, B=1 d=32768: bf16 call 2, fp8 calls 1-2 (split, merge) ($((SECONDS-t0)) s)"
grep -E "^  _decode|Duration  |DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|Waves Per SM" \
  "$OUT/ncu.txt" | sed -E 's/ {2,}/ /g' | head -60
S="smsp__average_warps_issue_stalled"
M="${S}_long_scoreboard_per_issue_active.ratio,${S}_barrier_per_issue_active.ratio,${S}_short_scoreboard_per_issue_active.ratio,${S}_wait_per_issue_active.ratio,${S}_mio_throttle_per_issue_active.ratio,${S}_math_pipe_throttle_per_issue_active.ratio,${S}_lg_throttle_per_issue_active.ratio,${S}_not_selected_per_issue_active.ratio,${S}_selected_per_issue_active.ratio,${S}_no_instruction_per_issue_active.ratio,${S}_dispatch_stall_per_issue_active.ratio"
timeout 45 "$NCU" --clock-control none -k regex:_decode_split --launch-skip 1 --launch-count 2 --metrics "$M" \
  python3 scripts/probe_decode_attention.py --depth 32768 > "$OUT/ncu_stalls.txt" 2>&1
echo "== split kernel stall reasons (warps per issued instruction; bf16 call 2, fp8 call 1) ($((SECONDS-t0)) s)"
grep -E "^  _decode|stalled" "$OUT/ncu_stalls.txt" | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/ {2,}/ /g' | head -30
timeout 80 python3 scripts/sweep_decode_attention.py --depths 32768,512 --bs 1 --budget-s 60 \
  --shapes "64,64,4,lib,128,32;64,64,8,1,128,32;64,64,4,1,128,16;32,32,4,1,128,32;64,64,8,2,128,32" \
  --out "$OUT/sweep_attn.jsonl" > "$OUT/sweep_attn.log" 2>&1
echo "== sweep ($((SECONDS-t0)) s)"; grep -E "B=1" "$OUT/sweep_attn.log" | cut -c12-150; grep records "$OUT/sweep_attn.log"

#!/usr/bin/env bash
# Device call: where the prefill MoE's two warpgroup-MMA launches stand at 512 tokens (12.1 of pp512 B=1's ~22 ms:
# ~300 us a layer for ~403 MB of experts, ~1.3 TB/s against 4.29), and the launch shapes that never change a bit.
# (1) the expert tiles' GPU test (the review's one-load rank kernel, run only in the interpreter so far);
# (2) Nsight Compute over gated and down at T = 512 as the model launches them: DRAM and L2 throughput, occupancy,
#     stall reasons; (3) the probe over each launch's slots (NS) and groups a step (GS) at 512 and 4,096 tokens, bits
#     against the default first, then CUDA-graph timings.
# Predictions: gated ~190 us, down ~110; L2 near 60% of its peak (x re-read by 8 / 32 programs a tile), DRAM ~35%;
# down with all 8 groups in flight (NS 9) ~30% faster at 512 tokens; gated slots no better than 3.  ~330 s
# Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_prefill_experts32.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_kernels_gpu.py -k "test_expert_tiles"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
S="smsp__average_warps_issue_stalled"
M="${S}_long_scoreboard_per_issue_active.ratio,${S}_barrier_per_issue_active.ratio,${S}_short_scoreboard_per_issue_active.ratio,${S}_wait_per_issue_active.ratio,${S}_mio_throttle_per_issue_active.ratio,${S}_math_pipe_throttle_per_issue_active.ratio,${S}_lg_throttle_per_issue_active.ratio,${S}_not_selected_per_issue_active.ratio,${S}_selected_per_issue_active.ratio,${S}_no_instruction_per_issue_active.ratio,dram__bytes_read.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct,l1tex__t_bytes.sum,sm__inst_executed.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed"
timeout 150 "$NCU" --clock-control none -k 'regex:_wg_experts_kernel' --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --metrics "$M" \
  python3 scripts/ncu_wg_kernels.py --prefill 512 > "$OUT/ncu_prefill.txt" 2>&1
echo "== ncu ($((SECONDS-t0)) s)"
grep -E "^  [_a-zA-Z].*\(|measured launch|Duration  |DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Registers Per|Shared Memory Config|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|inst_executed|tensor_cycles|bytes|hit_rate|throughput.avg" \
  "$OUT/ncu_prefill.txt" | sed -E 's/ {2,}/ /g' | head -60
grep -E "stalled" "$OUT/ncu_prefill.txt" | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/ {2,}/ /g' \
  | awk '$NF+0 >= 0.25' | head -30
timeout 200 python3 scripts/probe_prefill_experts.py --t 512,4096 --gated-ns 3,4,6 --down-ns 3,5,9 --gs 1,2 \
  --out "$OUT/probe-prefill-experts.jsonl" > "$OUT/probe.log" 2>&1; echo "probe rc $? ($((SECONDS-t0)) s)"
grep -E "^T=|^\|" "$OUT/probe.log" | tail -34; grep -E "Error|error" "$OUT/probe.log" | grep -v '"error": ""' | head -5
cache_news
echo "done ($((SECONDS-t0)) s)"

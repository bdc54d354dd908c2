#!/usr/bin/env bash
# Device call: what bounds the warpgroup-MMA kernels at a 64-stream decode (wg_gemv at 64 rows runs ~0.8 us a group
# and more slots did not help: bench/NOTES.md): Nsight Compute over scripts/ncu_wg_kernels.py's measured launches
# (mma_gemv and wg_gemv on the in_proj at 64 rows, the wgmma experts' gated and down at 64 tokens): duration,
# throughputs, occupancy, warp stalls; then the GPU tests of wg_gemv as the default (the kernel, the dispatch,
# mma_gemv's invariance / launch shapes / conv across both kernels, the tiny q4 model, the engine's graphs).  ~400 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
S="smsp__average_warps_issue_stalled"
M="${S}_long_scoreboard_per_issue_active.ratio,${S}_barrier_per_issue_active.ratio,${S}_short_scoreboard_per_issue_active.ratio,${S}_wait_per_issue_active.ratio,${S}_mio_throttle_per_issue_active.ratio,${S}_math_pipe_throttle_per_issue_active.ratio,${S}_lg_throttle_per_issue_active.ratio,${S}_not_selected_per_issue_active.ratio,${S}_selected_per_issue_active.ratio,${S}_no_instruction_per_issue_active.ratio,${S}_dispatch_stall_per_issue_active.ratio,${S}_membar_per_issue_active.ratio,${S}_sleeping_per_issue_active.ratio,${S}_misc_per_issue_active.ratio,${S}_tex_throttle_per_issue_active.ratio,${S}_drain_per_issue_active.ratio,lts__t_bytes.sum,dram__bytes_read.sum,sm__inst_executed.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
timeout 150 "$NCU" --clock-control none -k 'regex:_wg_experts_kernel|_mma_gemv_kernel' --launch-skip 6 --launch-count 6 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --metrics "$M" \
  python3 scripts/ncu_wg_kernels.py > "$OUT/ncu.txt" 2>&1
echo "== ncu ($((SECONDS-t0)) s)"
grep -E "^  [_a-zA-Z].*\(|measured launch|Duration  |DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Thr|Registers Per|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|Grid Size|Block Limit Reg|Block Limit Shared|lts__t_bytes|dram__bytes_read|inst_executed|tensor_cycles" \
  "$OUT/ncu.txt" | sed -E 's/ {2,}/ /g' | head -120
grep -E "^  [_a-zA-Z].*\(|stalled" "$OUT/ncu.txt" | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/ {2,}/ /g' | awk '$NF+0 >= 0.25 || /\(/' | head -80
TESTS_NAMED=1 gpu_tests 70 tests/gpu/test_wgmma_experts_gpu.py -k "wg_gemv"
TESTS_NAMED=1 gpu_tests 80 tests/gpu/test_mma_gemv_gpu.py -k "invariance or launch_shapes or conv"
TESTS_NAMED=1 gpu_tests 70 tests/gpu/test_model_mma_path.py -k "not moe and not head"
gpu_tests 60 tests/gpu/test_engine_graph_gpu.py
tar czf "$OUT/tcache.tgz" -C /tmp tcache && split -b 15M "$OUT/tcache.tgz" "$OUT/tcache.tgz." && rm "$OUT/tcache.tgz"
echo "done ($((SECONDS-t0)) s)"

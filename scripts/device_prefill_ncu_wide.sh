#!/usr/bin/env bash
# Device call: (1) what limits the tensor-core experts kernels at a 512-token prefill (pp512's largest cost, ~16 of
# ~33 ms: ~1.1 TB/s against the 4.3 of a copy): Nsight Compute over the gated gate/up and the scaled down at T = 512
# (scripts/probe_moe_t1.py --t 512, experts from DRAM), speed of light, occupancy, warp stalls, L2 / DRAM bytes;
# (2) the pp512 prefill profile at the default (tensor-core MoE); (3) scripts/device_wide_b1.sh's A/B of the wide
# GEMVs at batch 1 (head, wide, wide with the DeltaNet state read late, wide without the GEMV ring).  ~420 s
# Usage (H200 machine, repo root): bash scripts/device_prefill_ncu_wide.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, bench_tg
python3 scripts/probe_moe_t1.py --t 512 --only gated > "$OUT/probe.log" 2>&1
python3 scripts/probe_moe_t1.py --t 512 --only scaled >> "$OUT/probe.log" 2>&1; grep "per call" "$OUT/probe.log"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
S="smsp__average_warps_issue_stalled"
M="${S}_long_scoreboard_per_issue_active.ratio,${S}_barrier_per_issue_active.ratio,${S}_short_scoreboard_per_issue_active.ratio,${S}_wait_per_issue_active.ratio,${S}_mio_throttle_per_issue_active.ratio,${S}_math_pipe_throttle_per_issue_active.ratio,${S}_lg_throttle_per_issue_active.ratio,${S}_not_selected_per_issue_active.ratio,${S}_selected_per_issue_active.ratio,${S}_no_instruction_per_issue_active.ratio,${S}_dispatch_stall_per_issue_active.ratio,lts__t_bytes.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__inst_executed.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
for form in gated scaled; do
  timeout 100 "$NCU" --clock-control none -k regex:_mma_experts --launch-skip 2 --launch-count 1 --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    --metrics "$M" python3 scripts/probe_moe_t1.py --t 512 --calls 4 --only $form > "$OUT/ncu_$form.txt" 2>&1
  echo "== ncu $form T=512 ($((SECONDS-t0)) s)"
  grep -E "Duration  |DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Thr|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|Waves Per SM|Grid Size|Block Size|Shared Memory Config|Dynamic Shared|Static Shared|lts__t_bytes|dram__bytes_read|hit_rate|inst_executed|tensor_cycles|Block Limit" \
    "$OUT/ncu_$form.txt" | sed -E 's/ {2,}/ /g' | head -40
  grep -E "stalled" "$OUT/ncu_$form.txt" | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/ {2,}/ /g' | awk '$NF+0 >= 0.2' | head -20
done
timeout 150 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 0 -b 1 -r 3 --no-record \
  --profile-prefill > "$OUT/prefill_mma.log" 2>&1
echo "== prefill profile ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve" "$OUT/prefill_mma.log" | sort -u
grep -A30 "# prefill profile" "$OUT/prefill_mma.log" | cut -c1-140
for rep in 1 2; do
  bench_tg "head" 1 128 DELTASERVE_DECODE_GEMV=head
  bench_tg "wide" 1 128 DELTASERVE_DECODE_GEMV=wide
  [ $rep = 1 ] && bench_tg "wide, state late" 1 128 DELTASERVE_DECODE_GEMV=wide DELTASERVE_GDN_STATE_EARLY=0
  [ $rep = 1 ] && bench_tg "wide, no ring" 1 128 DELTASERVE_DECODE_GEMV=wide DELTASERVE_MMA_GEMV_AHEAD=1
  [ $rep = 1 ] && bench_tg "head, state late" 1 128 DELTASERVE_DECODE_GEMV=head DELTASERVE_GDN_STATE_EARLY=0
done
echo "done ($((SECONDS-t0)) s)"

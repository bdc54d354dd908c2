#!/usr/bin/env bash
# Device call: the decode attention's launch shape. The split program's variants' GPU tests (prefetch, swap, fp8), the split x merge sweep
# (scripts/sweep_decode_attention.py: bf16 and fp8 caches, B = 1 and 8, 32K and 512 tokens), then an in-model A/B per
# cache kind: the library's default against the sweep's pick (scripts/bench_attention_pick.py), tg128 at 512 and 32K
# tokens, batch 1, no records (the pick is not the commit's default yet). Before the sweep: Nsight Compute over one
# call per kind at 32K (scripts/probe_decode_attention.py).  ~540 s
# Usage (H200 machine, repo root): bash scripts/device_attn_pick.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
source "$(dirname "$0")/device_attn_ab.sh"  # attn_default_vs_pick
timeout 140 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_kv_fp8_gpu.py::test_attention \
  tests/gpu/test_kernels_gpu.py -k "attention_prefetch or attention_swap or test_attention" > "$OUT/tests.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
grep -E "^FAILED|^E  " "$OUT/tests.log" | head -8
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 90 "$NCU" --clock-control none -k regex:_decode_ --launch-skip 2 --launch-count 6 --section SpeedOfLight \
  --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  python3 scripts/probe_decode_attention.py --depth 32768 > "$OUT/ncu.txt" 2>&1
echo "== ncu, B=1 d=32768: bf16 call 2, fp8 calls 1-2 (split, merge) ($((SECONDS-t0)) s)"
grep -E "^  _decode|Duration  |DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Block Limit (Reg|Sha)|Dynamic Shared|Warp Cycles Per Issued" \
  "$OUT/ncu.txt" | sed -E 's/ {2,}/ /g' | head -70
timeout 220 python3 scripts/sweep_decode_attention.py --depths 32768,512 --bs 1,8 --budget-s 190 \
  --out "$OUT/sweep_attn.jsonl" > "$OUT/sweep_attn.log" 2>&1
echo "== decode attention sweep ($((SECONDS-t0)) s), B=1 d=32768:"
grep -E "B=1 d=32768" "$OUT/sweep_attn.log" | cut -c12-150
grep -E "records|FAIL|ERROR" "$OUT/sweep_attn.log" | head -5
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -n 128 -d 512,32768 -b 1 -r 3 --no-record"
attn_default_vs_pick "$OUT/sweep_attn.jsonl" 75 75 $M

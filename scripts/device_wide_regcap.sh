#!/usr/bin/env bash
# Device call (prepared, not yet run): the "wide" decode GEMVs (the >= 8192-row weights on the tensor-core GEMV) with
# their registers capped (DELTASERVE_MMA_GEMV_MAXNREG; 80 uncapped: 772 in-projection programs fill every SM's
# register file, so under PDL the DeltaNet step after them, which now reads its state before its wait, cannot become
# resident early; the graph profile had the step +0.8 us and down +0.5 us a layer under wide). GPU test: capped ==
# uncapped bit for bit. Then tg128 @ d512 B=1: head, wide uncapped, wide 72, wide 64 (twice), and B=64 for wide at
# 72 against head.  ~330 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests 80 tests/gpu/test_mma_gemv_gpu.py -k register_cap
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 512"
run() {  # run LABEL B N ENV...
  local label=$1 b=$2 n=$3; shift 3
  env "$@" timeout 100 python3 -m deltaserve bench $M -b "$b" -n "$n" > "$OUT/bench.log" 2>&1
  echo "== $label B=$b ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c1-110)"
}
for rep in 1 2; do
  run head 1 128 DELTASERVE_DECODE_GEMV=head
  run "wide" 1 128 DELTASERVE_DECODE_GEMV=wide
  run "wide cap 72" 1 128 DELTASERVE_DECODE_GEMV=wide DELTASERVE_MMA_GEMV_MAXNREG=72
  run "wide cap 64" 1 128 DELTASERVE_DECODE_GEMV=wide DELTASERVE_MMA_GEMV_MAXNREG=64
done
run head 64 32 DELTASERVE_DECODE_GEMV=head
run "wide cap 72" 64 32 DELTASERVE_DECODE_GEMV=wide DELTASERVE_MMA_GEMV_MAXNREG=72

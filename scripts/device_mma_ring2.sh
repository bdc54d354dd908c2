#!/usr/bin/env bash
# Device call: the tensor-core MoE at batch 1 after the register ring (device_mma_ring.sh: 4,4 gave 584.5 against
# 569.7 for AHEAD 2,1 and 610.5 for the CUDA-core MoE): the ring per launch (gate/up 3-5, down 4 / 7) and the MoE's
# input norm writing the group sums alone (DELTASERVE_MOE_NORM_PREP=sums, the default now) against the full prep;
# then B=64 with the chosen pair; GPU tests of the norm's prep and the tensor-core paths end to end.  ~330 s
# Usage (H200 machine, repo root): bash scripts/device_mma_ring2.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -n 128 -r 3 --no-record -d 512"
for v in "cuda - sums 1" "mma 4,7 sums 1" "mma 4,7 full 1" "mma 4,4 sums 1" "mma 3,7 sums 1" "mma 5,7 sums 1" \
         "mma 4,7 sums 1" "cuda - sums 1" "mma 4,7 sums 64"; do
  set -- $v
  if [ "$2" = "-" ]; then unset DELTASERVE_MMA_AHEAD; else export DELTASERVE_MMA_AHEAD=$2; fi
  DELTASERVE_MOE=$1 DELTASERVE_MOE_NORM_PREP=$3 timeout 150 python3 -m deltaserve bench $M -b $4 > "$OUT/bench.log" 2>&1
  echo "== MoE $1 ahead $2 norm $3 ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c1-110)"
done
unset DELTASERVE_MMA_AHEAD
gpu_tests 200 tests/gpu/test_gemv_gpu.py tests/gpu/test_kernels_gpu.py tests/gpu/test_model_mma_path.py -k "prep or mma or norms"
tar czf "$OUT/tcache.tgz" -C /tmp tcache && echo "triton cache packed: $(du -h "$OUT/tcache.tgz" | cut -f1)"

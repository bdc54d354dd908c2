#!/usr/bin/env bash
# Device call: (1) the GPU tests not yet run at the 26113e4 defaults (the staged-sums test whole, its K = 320 case
# mended; the tiny q4 model in the wgmma GEMV modes, which now run the staged sums and carried slots), (2) where a
# 64-stream decode step goes now (`bench --profile-graph`, tg @ d512), (3) the 8-prompt pp512 that fell from 28,344
# to 24,836 on unchanged kernels (`bench --profile-prefill` at 8 prompts, and 1 for comparison), (4) the DeltaNet
# decode step's launch shapes at 64 streams (scripts/sweep_gdn_step.py: 90 us a layer in the model against ~60 of
# state traffic). The Triton cache goes back in $OUT.  ~480 s
# Usage (H200 machine, repo root): bash scripts/device_profiles64.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests
TESTS_NAMED=1 gpu_tests 100 tests/gpu/test_wgmma_experts_gpu.py -k "xs_smem"
TESTS_NAMED=1 gpu_tests 170 tests/gpu/test_model_mma_path.py -k "mma-wg"
M="--preset qwen3.6-35b-a3b --quant q4 --no-record"
timeout 120 python3 -m deltaserve bench $M -p 16 -n 32 -d 512 -b 64 -r 2 --profile-graph > "$OUT/graph64.log" 2>&1
echo "== graph profile B=64 ($((SECONDS-t0)) s)"; grep -A40 "decode graph profile" "$OUT/graph64.log" | cut -c1-150
for b in 8 1; do
  timeout 100 python3 -m deltaserve bench $M -p 512 -n 0 -d 0 -b $b -r 2 --profile-prefill > "$OUT/pp_prof$b.log" 2>&1
  echo "== prefill profile B=$b ($((SECONDS-t0)) s)"; grep -A45 -i "prefill profile" "$OUT/pp_prof$b.log" | cut -c1-150
done
timeout 90 python3 scripts/sweep_gdn_step.py --bs 64 --budget-s 70 --out "$OUT/sweep_gdn.jsonl" > "$OUT/sweep_gdn.log" 2>&1
echo "== gdn step sweep ($((SECONDS-t0)) s)"; tail -15 "$OUT/sweep_gdn.log"
tar czf "$OUT/tcache.tgz" -C /tmp tcache && split -b 15M "$OUT/tcache.tgz" "$OUT/tcache.tgz." && rm "$OUT/tcache.tgz"
echo "done ($((SECONDS-t0)) s)"

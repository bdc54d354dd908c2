#!/usr/bin/env bash
# Device call: the two-group steps' GPU tests left from the last call (its windows cut them): GS 2 == GS 1 bit for
# bit at 64 and 512 tokens (MoE and wg_gemv), the tiny q4 model end to end in the wgmma modes at the new defaults
# (CPU reference whole and in chunks, batch invariance, graph == eager); then the 64-stream graph profile at them.
# Carry .tcache.txz (the last call's wgmma kernels). Usage (H200 machine, repo root): bash scripts/device_groups3.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests
TESTS_NAMED=1 gpu_tests 220 tests/gpu/test_wgmma_experts_gpu.py -k "step_groups and not 1-"
TESTS_NAMED=1 gpu_tests 160 tests/gpu/test_model_mma_path.py -k "wgmma or wg-gemv or wg-xs"
timeout 90 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 --no-record -p 16 -n 32 -d 512 -b 64 -r 2 \
  --profile-graph > "$OUT/graph64.log" 2>&1
echo "== graph profile B=64 ($((SECONDS-t0)) s)"; grep -A25 "decode graph profile" "$OUT/graph64.log" | cut -c1-150
echo "done ($((SECONDS-t0)) s)"

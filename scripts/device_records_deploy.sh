#!/usr/bin/env bash
# Device call: records at this commit (scripts/device_bench_all.sh: B=1 at every depth with the profile, then 64 and
# 8 streams, each -b its own deployment's decode GEMV), after the experts kernels' GPU tests and the tensor-core model
# paths at the final defaults (wgmma from 512 rows, the partial-sum order); then the 64-stream step profiled with
# distinct tokens.  ~420 s
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_records_deploy.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, the Triton cache
TEST_TIMEOUT=150 TEST_FILES="tests/gpu/test_wgmma_experts_gpu.py tests/gpu/test_model_mma_path.py" \
  TEST_FILTER="not head" bash "$(dirname "$0")/device_bench_all.sh" 2>&1 | \
  grep -E "passed|failed|^\| deltaserve|FAILED|^E  |decode step profile|^  [a-z]" | head -60
echo "== records done ($((SECONDS-t0)) s)"
timeout 90 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 -n 16 -d 512 -b 64 -r 1 --profile \
  --no-record > "$OUT/profile64.log" 2>&1
echo "== B=64 profile ($((SECONDS-t0)) s)"; grep -A24 "decode step profile" "$OUT/profile64.log" | cut -c1-130

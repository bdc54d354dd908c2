#!/usr/bin/env bash
# One device call at one commit: the GPU tests of the decode path (end to end first, then the kernels changed
# last), then the full benchmark (B=1 at every depth with a profile, then 64 and 8 streams at depth 512), records
# under $OUT. Fits one 600 s call: 200 + 190 + 160 s at most.
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_bench_all.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
M="--preset qwen3.6-35b-a3b --quant q4"
# TEST_FILES: which files, in order (a test cut by the window is one the files before it left no time for)
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -m gpu -q -rf -p no:cacheprovider \
  ${TEST_FILES:-tests/gpu/test_model_fast_path.py tests/gpu/test_kernels_gpu.py tests/gpu/test_gemv_gpu.py} \
  -k "${TEST_FILTER:-fast_path or decode_attention_gate or router_last or gemv_batch or moe_v2_fused or gdn_decode}" \
  2>&1 | tee "$OUT/tests.log" | tail -15
timeout 190 python3 -m deltaserve bench $M -p 512 -n 128 -d 0,512,4096,8192,32768 -b 1 -r 5 --profile \
  --results "$OUT" 2>&1 | grep -v Warn | tee "$OUT/bench_b1.log" | tail -40
timeout 160 python3 -m deltaserve bench $M -p 512 -n 128 -d 512 -b 64,8 -r 3 --results "$OUT" 2>&1 \
  | grep -v Warn | tee "$OUT/bench_b64.log" | tail -6

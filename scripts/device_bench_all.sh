#!/usr/bin/env bash
# One device call at one commit: GPU tests of the decode path, a quick A/B of a kernel choice, then the full
# benchmark (B=1 at every depth, 8 and 64 streams at depth 512) with records under $OUT.
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_bench_all.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
M="--preset qwen3.6-35b-a3b --quant q4"
timeout "${TEST_TIMEOUT:-170}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_model_fast_path.py \
  tests/gpu/test_gemv_gpu.py tests/gpu/test_kernels_gpu.py -k "${TEST_FILTER:-fast_path or inline or conv or fused or topk or qk or gate}" \
  2>&1 | tee "$OUT/tests.log" | tail -15
rate() { grep -E "tg64 @ d512" "$1" | head -1 | awk -F'|' '{print $7}' | awk '{print $1}'; }
timeout 60 python3 -m deltaserve bench $M -p 16 -n 64 -d 512 -b 1 -r 2 --no-record > "$OUT/ab_fused.log" 2>&1
DELTASERVE_MOE_TOPK=split timeout 60 python3 -m deltaserve bench $M -p 16 -n 64 -d 512 -b 1 -r 2 --no-record \
  > "$OUT/ab_split.log" 2>&1
fused=$(rate "$OUT/ab_fused.log"); split=$(rate "$OUT/ab_split.log")
echo "A/B tg64 @ d512 B=1: top-k fused $fused tok/s, split $split tok/s"
if python3 -c "import sys; sys.exit(0 if float('${split:-0}') > float('${fused:-0}') else 1)"; then
  export DELTASERVE_MOE_TOPK=split
fi
timeout 170 python3 -m deltaserve bench $M -p 512 -n 128 -d 0,512,4096,8192,32768 -b 1 -r 5 --profile \
  --results "$OUT" 2>&1 | grep -v Warn | tee "$OUT/bench_b1.log" | tail -22
timeout 120 python3 -m deltaserve bench $M -p 512 -n 128 -d 512 -b 8,64 -r 3 --results "$OUT" 2>&1 \
  | grep -v Warn | tee "$OUT/bench_b64.log" | tail -6

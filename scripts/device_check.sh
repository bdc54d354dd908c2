#!/usr/bin/env bash
# One device call: install the carried wheels, run the GPU end-to-end tests, then the benchmark.
# Usage (on the H200 machine, repo root): bash scripts/device_check.sh "<bench args>"
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
if [ -n "${TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -m gpu $TESTS -x -q -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -25
fi
if [ -n "${1:-}" ]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 -m deltaserve bench $1 --results "$OUT" 2>&1 | tee "$OUT/bench.log"
fi

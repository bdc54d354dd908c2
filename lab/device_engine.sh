#!/usr/bin/env bash
# The engine-path device call (issue 63), on any H100 / H200, repo root; carry .whl (and .tcache.tgz when a previous
# call brought one back). Usage: bash lab/device_engine.sh [tests|bench|all]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
[ -f .tcache.tgz ] && [ ! -d /tmp/tcache ] && tar xzf .tcache.tgz -C /tmp
mkdir -p /tmp/tcache; touch /tmp/tcache/.seeded
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
what=${1:-all}
if [ "$what" = tests ] || [ "$what" = all ]; then
  timeout ${TESTS_LIMIT:-240} python3 -m pytest -m gpu -q -rf -s -p no:cacheprovider tests/gpu/test_sampling_gpu.py \
    tests/gpu/test_engine_exact_gpu.py tests/gpu/test_engine_graph_gpu.py > "$OUT/tests.log" 2>&1
  echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
  grep -E "^CUTS|FAILED|^E  " "$OUT/tests.log" | cut -c1-160 | head -30
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  timeout ${BENCH_LIMIT:-300} python3 -m deltaserve bench --engine --preset qwen3.6-35b-a3b --quant q4 -n 128 \
    -d ${DEPTHS:-512} -b ${BATCHES:-1,64,8} -r 2 --results "$OUT" ${BENCH_EXTRA:-} > "$OUT/bench_engine.log" 2>&1
  echo "bench ($((SECONDS-t0)) s):"; grep -E "^\| deltaserve|Error|error" "$OUT/bench_engine.log" | sort -u | cut -c1-150
  grep -oE "host [0-9.]+ ms/step; [0-9.]+ of the graph" "$OUT"/*.jsonl | head -20
fi
# the Triton cache compiled here, for the next call (carry it back as .tcache.tgz)
(cd /tmp && tar czf "$OUT/tcache.tgz" tcache) && ls -la "$OUT/tcache.tgz"

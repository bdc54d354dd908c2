# The tensor-core device calls' shared set-up, sourced by lab/device_mma_*.sh (H200 machine, repo root): $OUT,
# the carried wheels (.whl/, listed in wheels.txt) installed into /tmp/site, the repository and them on PYTHONPATH,
# one Triton cache per machine (seeded from a carried .tcache.tgz: a previous call's $OUT/tcache.tgz, ignored by
# git; or .tcache.txz), t0 for the calls' elapsed-seconds prints, and gpu_tests for a call's test window.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
t0=$SECONDS
# (once per machine: a script sourced by another call's script finds /tmp/tcache/.seeded and skips it)
if [ "$TRITON_CACHE_DIR" = /tmp/tcache ] && [ ! -f /tmp/tcache/.seeded ]; then
  [ -f .tcache.tgz ] && tar xzf .tcache.tgz -C /tmp
  # or an xz one (a quarter of the gzip size; python's lzma, so no xz binary is needed there)
  [ -f .tcache.txz ] && python3 -c "import tarfile; tarfile.open('.tcache.txz').extractall('/tmp', filter='tar')"
  mkdir -p /tmp/tcache && touch /tmp/tcache/.seeded
fi

GPU_TESTS_RUN=0
gpu_tests() {  # gpu_tests SECONDS PYTEST_ARGS...: the GPU tests under a time limit, log in $OUT/tests[_N].log (one
  # per call of this in a device call, so a later run never overwrites an earlier one's), summary (TESTS_NAMED=1:
  # pytest -v, and each test's PASSED / FAILED line, so a cut window still names what passed; without it a cut
  # window still counts the dots and Fs of -q)
  local limit=$1; shift
  GPU_TESTS_RUN=$((GPU_TESTS_RUN + 1))
  local log="$OUT/tests.log"; [ "$GPU_TESTS_RUN" -gt 1 ] && log="$OUT/tests_$GPU_TESTS_RUN.log"
  timeout "$limit" python3 -m pytest -m gpu $([ "${TESTS_NAMED:-0}" = 1 ] && echo -v || echo -q) -rf \
    -p no:cacheprovider "$@" > "$log" 2>&1
  echo "tests ($((SECONDS-t0)) s, $(basename "$log")): $(grep -E 'passed|failed' "$log" | tail -1)"
  [ "${TESTS_NAMED:-0}" = 1 ] || echo "  progress: $(grep -oE '^[.FEsx]+' "$log" | tr -d '\n' | \
    awk '{n = gsub(/\./, "."); f = gsub(/F/, "F"); print n " passed, " f " failed so far"}')"
  grep -E "$([ "${TESTS_NAMED:-0}" = 1 ] && echo 'PASSED|')FAILED|^E  " "$log" | cut -c1-150 | head -20
}

# bench_tg LABEL B N ENV...: one decode timing under the given environment (tg N @ $BENCH_ARGS, B streams; limit
# $BENCH_TIMEOUT s, default 90: a cold Triton cache needs more), its tok/s line; the whole output in $OUT/bench.log
BENCH_ARGS=${BENCH_ARGS:-"--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 512"}
bench_tg() {
  local label=$1 b=$2 n=$3; shift 3
  env "$@" timeout "${BENCH_TIMEOUT:-90}" python3 -m deltaserve bench $BENCH_ARGS -b "$b" -n "$n" > "$OUT/bench.log" 2>&1
  echo "== $label B=$b ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*tg' "$OUT/bench.log" | sort -u | cut -c50-110)"
}

# bench_pp LABEL B ENV...: one prefill timing under the given environment (pp512 @ d0, -r 3, B prompts), its tok/s
# line and any error; the whole output in $OUT/pp.log
bench_pp() {
  local label=$1 b=$2; shift 2
  env "$@" timeout "${PP_TIMEOUT:-120}" python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 0 -b "$b" -r 3 \
    --no-record > "$OUT/pp.log" 2>&1
  echo "== $label B=$b ($((SECONDS-t0)) s): $(grep -E '^\| deltaserve.*pp' "$OUT/pp.log" | sort -u | cut -c50-110)"
  grep -E "Error|error" "$OUT/pp.log" | tail -3
}

# prefill_profile TOP ENV...: the prefill graph's profile (bench --profile-prefill-graph, pp512 @ d0, B=1) under the
# given environment: its class table and TOP kernels, and the peak memory line; the whole output in
# $OUT/prefill_graph.log
prefill_profile() {
  local top=$1; shift
  env "$@" timeout 100 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 0 -b 1 -r 1 \
    --no-record --profile-prefill-graph --profile-top "$top" > "$OUT/prefill_graph.log" 2>&1
  echo "== profile ($((SECONDS-t0)) s)"; grep -A30 "# prefill graph profile" "$OUT/prefill_graph.log" | cut -c1-130
  grep "peak GPU" "$OUT/prefill_graph.log"
}

# bench_records [LIMIT_MULTI [LIMIT_B1]]: the records of a device call at this tree ($DELTASERVE_COMMIT): tg128 and
# pp512 @ d512 at 64 and 8 streams (-r 3), then batch 1 at every depth (-r 5), each under its own limit (default
# 150 / 110 s), appended under $OUT; their table rows, the whole output in $OUT/bench_b64.log / bench_b1.log
bench_records() {
  local m="--preset qwen3.6-35b-a3b --quant q4"
  timeout "${1:-150}" python3 -m deltaserve bench $m -p 512 -n 128 -d 512 -b 64,8 -r 3 --results "$OUT" 2>&1 \
    | grep -v Warn > "$OUT/bench_b64.log"; grep -E "^\| deltaserve" "$OUT/bench_b64.log" | sort -u
  timeout "${2:-110}" python3 -m deltaserve bench $m -p 512 -n 128 -d 0,512,4096,8192,32768 -b 1 -r 5 \
    --results "$OUT" 2>&1 | grep -v Warn > "$OUT/bench_b1.log"; grep -E "^\| deltaserve" "$OUT/bench_b1.log" | sort -u
}

# logs_into_one: the call's test logs as one file, $OUT/all_tests.txt, and bench.log dropped (at most 8 files come
# back from $OUT)
logs_into_one() {
  cat "$OUT"/tests*.log > "$OUT/all_tests.txt" && rm -f "$OUT"/tests*.log "$OUT/bench.log"
}

# cache_news: the Triton cache entries compiled since the seed (newer than /tmp/tcache/.seeded) as
# $OUT/tcache_new.tgz.* pieces of 15 MiB, to merge into .tcache.txz here (at most 8 files come back from $OUT)
cache_news() {
  (cd /tmp && find tcache -newer tcache/.seeded -type f ! -name .seeded | tar czf - -T -) \
    | split -b 15M - "$OUT/tcache_new.tgz."
  echo "new cache entries: $(cat "$OUT"/tcache_new.tgz.* | wc -c) bytes in $(ls "$OUT"/tcache_new.tgz.* | wc -l) pieces"
}

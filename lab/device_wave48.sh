#!/usr/bin/env bash
# This wave's device calls (any H100 / H200, repo root; carry .whl and .tcache.tgz). Usage:
#   bash lab/device_wave48.sh tests     the GPU tests TESTS (files, or FILE@EXPR with '+' for spaces: that file's -k),
#                                       TESTS_K (the others' -k), each file under PER_FILE seconds; default: (engine exactness, sampling, prefix cache, vision, structured)
#   bash lab/device_wave48.sh engine    bench --engine: d512 / d32768 at 1, 8, 64 streams, prefix TTFT, mixed load
#   bash lab/device_wave48.sh extras    bench vision, bench --structured-output
#   bash lab/device_wave48.sh spec      bench --engine --speculative-tokens (simulated acceptance), SPEC_K / SPEC_A / BATCHES
#   bash lab/device_wave48.sh probes    lab/probe_row_bits.py (a row's bits against the rows beside it, 35B shapes)
#                                       and lab/probe_spec_step.py (a drafting step's parts timed)
#   bash lab/device_wave48.sh diag      the spec-step probe with kernel profiles (SPEC_K, BATCHES), the prefill graph
#                                       fault's variants (lab/probe_prefill_fault.py), the row-bits probe
#   bash lab/device_wave48.sh step      the spec-step probe alone (SPEC_K, BATCHES) and the prefill graph fault probe
#   bash lab/device_wave48.sh diverge   where drafted replies first differ from drafting off (lab/probe_spec_divergence.py)
#   bash lab/device_wave48.sh bits      the same with the logits' bits compared row by row (--logits), per BITS_CFGS
#                                       ("streams:k" pairs), drafting's default variant; MAXROWS lifts the verify's
#                                       16-row limit for the run (e.g. MAXROWS=192 BITS_CFGS="8:2 64:2")
#   bash lab/device_wave48.sh fault     the prefill graph fault's variants alone (lab/probe_prefill_fault.py)
#   bash lab/device_wave48.sh ab        issue 58's A/B: lab/ab_trees.py bits (AB_BITS_ARGS, e.g. --no-graphs) then speed,
#                                       this tree against .old/ (carry it:
#                                       mkdir .old && git archive OLD | tar -x -C .old; echo /.old/ >> .git/info/exclude)
#   bash lab/device_wave48.sh series    lab/ab_trees.py series over the trees SERIES (carried folders, e.g. .ab/<commit>),
#                                       the bench arguments SERIES_BENCH; the records come back as one series.tgz
#   bash lab/device_wave48.sh all       tests then engine, each under its own limit (TESTS_LIMIT, LIMIT)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
# the measured commit: pass DELTASERVE_COMMIT=$(git rev-parse --short HEAD) (the copy's .git may be older)
[ -f .tcache.tgz ] && [ ! -f /tmp/tcache/.seeded ] && tar xzf .tcache.tgz -C /tmp
mkdir -p /tmp/tcache; touch /tmp/tcache/.seeded
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
M="--preset qwen3.6-35b-a3b --quant q4"
TESTS=${TESTS:-"tests/gpu/test_sampling_gpu.py tests/gpu/test_engine_exact_gpu.py tests/gpu/test_prefix_cache_gpu.py
  tests/gpu/test_engine_graph_gpu.py tests/gpu/test_server_gpu.py tests/gpu/test_vision_gpu.py
  tests/gpu/test_structured_gpu.py tests/gpu/test_model_fast_path.py"}
run_tests() {  # each file under its own limit (PER_FILE), so a slow file leaves the others' summaries
  local deadline=$((SECONDS + ${LIMIT:-500}))
  for entry in $TESTS; do  # FILE or FILE@K-EXPRESSION (spaces in the expression as '+')
    local f=${entry%%@*} k=""; [ "$entry" != "$f" ] && k=$(echo "${entry#*@}" | tr '+' ' ')
    local left=$((deadline - SECONDS)); [ $left -lt 20 ] && { echo "$f: not run (limit)" >> "$OUT/tests.log"; continue; }
    local lim=$(( ${PER_FILE:-200} < left ? ${PER_FILE:-200} : left ))
    echo "### $f" >> "$OUT/tests.log"
    k=${k:-${TESTS_K:-}}
    timeout $lim python3 -m pytest -m gpu -v --tb=short -rf -p no:cacheprovider $f ${k:+-k "$k"} \
      >> "$OUT/tests.log" 2>&1 || echo "$f: exit $?" >> "$OUT/tests.log"
  done
  echo "tests ($((SECONDS-t0)) s):"
  grep -E "^### |passed|failed|FAILED|^E  |not run|: exit" "$OUT/tests.log" | cut -c1-220 | head -60
}
run_engine() {
  timeout ${LIMIT:-540} python3 -m deltaserve bench --engine $M -n 128 -d ${DEPTHS:-512,32768} -b ${BATCHES:-1,64,8} \
    -r 2 --prefix ${PREFIX:-1024,4096,16384} ${MIXED:---mixed --mixed-seconds 15} --results "$OUT" \
    > "$OUT/bench_engine.log" 2>&1
  echo "bench ($((SECONDS-t0)) s):"; grep -E "^\| deltaserve|Error|error|cold/cached" "$OUT/bench_engine.log" | cut -c1-170
  grep -ohE "sampling [a-z]+, detokenised; host [0-9.]+ ms/step; [0-9.]+ of the graph replay \([0-9.]+" "$OUT"/*.jsonl
  grep -ohE "alone [0-9.]+ tok/s; ratio [0-9.]+" "$OUT"/*.jsonl
}
run_spec() {
  timeout ${LIMIT:-300} python3 -m deltaserve bench --engine $M -n ${N:-128} -d 512 -b ${BATCHES:-1,8,64} -r 2 \
    --sampling greedy --speculative-tokens ${SPEC_K:-1,2,3} --acceptance ${SPEC_A:-0.6,0.8,1.0} --results "$OUT" \
    > "$OUT/bench_spec.log" 2>&1
  echo "spec ($((SECONDS-t0)) s):"; grep -E "^\| deltaserve|Error|error|simulated|equal" "$OUT/bench_spec.log" | cut -c1-170
}
for phase in ${@:-tests}; do case "$phase" in
spec) run_spec ;;
probes)
  timeout ${LIMIT:-300} python3 lab/probe_row_bits.py --streams ${STREAMS:-64,1} 2>&1 | tee "$OUT/probe_row_bits.log" | grep "^|"
  timeout ${LIMIT2:-200} python3 lab/probe_spec_step.py --k 3 --batch 1,4 2>&1 | tee "$OUT/probe_spec_step.log" | grep "^|"
  ;;
diag)  # a drafting step's parts kernel by kernel; the prefill graph fault; a row's bits beside other rows
  timeout ${LIMIT2:-240} python3 lab/probe_spec_step.py --k ${SPEC_K:-1,2,3} --batch ${BATCHES:-1} --profile 22 \
    > "$OUT/probe_spec_step.log" 2>&1; grep "^|" "$OUT/probe_spec_step.log"
  timeout 200 python3 lab/probe_prefill_fault.py > "$OUT/probe_prefill_fault.log" 2>&1
  grep "^|" "$OUT/probe_prefill_fault.log"
  timeout ${LIMIT:-200} python3 lab/probe_row_bits.py --streams ${STREAMS:-64,1} > "$OUT/probe_row_bits.log" 2>&1
  grep "^|" "$OUT/probe_row_bits.log"
  ;;
step)  # the drafting step's parts (SPEC_K, BATCHES) with kernel profiles; the prefill graph fault's variants
  timeout ${LIMIT2:-150} python3 lab/probe_spec_step.py --k ${SPEC_K:-3} --batch ${BATCHES:-1} --profile 14 \
    > "$OUT/probe_spec_step.log" 2>&1; grep "^|" "$OUT/probe_spec_step.log"
  timeout ${LIMIT3:-100} python3 lab/probe_prefill_fault.py > "$OUT/probe_prefill_fault.log" 2>&1
  grep "^|" "$OUT/probe_prefill_fault.log"
  ;;
diverge)  # where drafted replies first differ from drafting off (BATCHES streams, SPEC_K), in variants
  timeout ${LIMIT:-400} python3 lab/probe_spec_divergence.py --batch ${BATCHES:-8} --k ${SPEC_K:-2} \
    --variants ${VARIANTS:-default,no-follow,k1} > "$OUT/probe_spec_divergence.log" 2>&1
  grep -vE "^#|Warn" "$OUT/probe_spec_divergence.log" | tail -30
  ;;
bits)  # the first position whose logits' bits differ from drafting off, per streams:k
  for cfg in ${BITS_CFGS:-8:2 4:3 2:3 1:3}; do
    timeout ${LIMIT:-150} python3 lab/probe_spec_divergence.py --batch ${cfg%:*} --k ${cfg#*:} \
      --variants ${VARIANTS:-default} --logits ${MAXROWS:+--max-verify-rows $MAXROWS} >> "$OUT/probe_bits.log" 2>&1
    echo "bits $cfg ($((SECONDS-t0)) s)"
  done
  grep -vE "^#|Warn|^\|" "$OUT/probe_bits.log" | cut -c1-230 | tail -60
  ;;
fault)
  timeout ${LIMIT3:-200} python3 lab/probe_prefill_fault.py > "$OUT/probe_prefill_fault.log" 2>&1
  grep "^|" "$OUT/probe_prefill_fault.log"; tail -5 "$OUT/probe_prefill_fault.log" | cut -c1-300
  ;;
ab)  # the old tree (.old, carried) against this one: the same bits, the same speed
  [ -d .old/deltaserve ] || { echo "ab: no .old/deltaserve (carry the old tree as .old)"; exit 1; }
  timeout ${LIMIT:-200} python3 lab/ab_trees.py bits --old .old ${AB_BITS_ARGS:-} > "$OUT/ab_bits.log" 2>&1
  tail -8 "$OUT/ab_bits.log"
  timeout ${LIMIT2:-380} python3 lab/ab_trees.py speed --old .old --rounds ${ROUNDS:-2} > "$OUT/ab_speed.log" 2>&1
  tail -12 "$OUT/ab_speed.log"
  ;;
series)  # where an A/B found a difference: the commits between, timed one after another
  timeout ${LIMIT:-540} python3 lab/ab_trees.py series $SERIES ${SERIES_BENCH:+--bench "$SERIES_BENCH"} \
    --out "$OUT/series" > "$OUT/ab_series.log" 2>&1; grep -vE "^\| deltaserve" "$OUT/ab_series.log" | tail -16
  (cd "$OUT" && tar czf series.tgz series && rm -rf series)
  ;;
tests) run_tests ;;
engine) run_engine ;;
all) LIMIT=${TESTS_LIMIT:-250} run_tests; LIMIT=${ENGINE_LIMIT:-320} run_engine ;;
extras)
  timeout ${LIMIT:-270} python3 -m deltaserve bench vision $M --images 1,4 --vit-batch 8 -r 5 --results "$OUT" \
    > "$OUT/bench_vision.log" 2>&1
  echo "vision ($((SECONDS-t0)) s):"; grep -vE "^#|Warn" "$OUT/bench_vision.log" | tail -8 | cut -c1-170
  timeout ${LIMIT2:-270} python3 -m deltaserve bench $M --structured-output -b 1,64 -p 32 -n 128 -r 3 \
    --results "$OUT" > "$OUT/bench_structured.log" 2>&1
  echo "structured ($((SECONDS-t0)) s):"; grep -vE "^#|Warn" "$OUT/bench_structured.log" | tail -8 | cut -c1-170
  ;;
esac; done
(cd /tmp && tar czf "$OUT/tcache.tgz" tcache)

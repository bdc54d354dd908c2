#!/usr/bin/env bash
# Serving benchmark on the GPU machine (issue 56): `deltaserve serve --preset qwen3.6-35b-a3b --quant q4` driven by
# `deltaserve bench-serve` (streamed /v1/completions of random token ids, ignore_eos, greedy) at concurrency 1, 8, 64
# and 256; records (test "serve") appended under $OUT. Each server start builds the random weights on the GPU and
# captures its graphs (untimed); each run has its own time box. ~5-6 minutes in all with a warm Triton cache.
#   Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash lab/serve_bench.sh
#   RUNS="1 8 64 256" picks runs; LLAMA_SERVER=/path/llama-server GGUF=/path/q4_k_m.gguf adds llama.cpp at 1, 8, 64
#   with the same generator (GGUF: python -m deltaserve export-gguf --preset qwen3.6-35b-a3b --random --type q4_k_m).
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
RUNS=${RUNS:-"1 8 64 256"}
PORT=8011
MODEL="--preset qwen3.6-35b-a3b --quant q4"
LABELS="--model-label qwen3.6-35b-a3b --results $OUT"
SERVER=

start() {  # start NAME ARGS...: a server in the background, then wait for /health (at most 300 s)
  local name=$1; shift
  "$@" > "$OUT/server_$name.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && { echo "== $name up ($((SECONDS-t0)) s)"; return 0; }
    kill -0 $SERVER 2>/dev/null || break
    sleep 0.5
  done
  echo "== $name did not come up:"; tail -20 "$OUT/server_$name.log"; stop; return 1
}

stop() {
  [ -n "$SERVER" ] && kill -INT $SERVER 2>/dev/null && wait $SERVER 2>/dev/null
  SERVER=
  nvidia-smi --query-gpu=memory.used --format=csv,noheader | head -1 | sed 's/^/   GPU memory after stop: /'
}

ds() {  # ds MAX_NUM_SEQS EXTRA...: deltaserve serving the preset
  local seqs=$1; shift
  start "ds$seqs" python3 -m deltaserve serve $MODEL --port $PORT --max-num-seqs "$seqs" \
    --uvicorn-log-level warning "$@"
}

load() {  # load LIMIT ARGS...: one bench-serve run under a hard time limit; its summary lines
  local limit=$1; shift
  timeout "$limit" python3 -m deltaserve bench-serve --base-url "http://127.0.0.1:$PORT" $LABELS "$@" \
    > "$OUT/load.log" 2>&1
  echo "-- $* ($((SECONDS-t0)) s, rc $?)"; grep -E "^#|^  " "$OUT/load.log" | grep -v "record appended"
}

has() { [[ " $RUNS " == *" $1 "* ]]; }
q=--quant-label; P512="--input-len 512 --output-len 128"

# batch 1: a deployment for one stream (max-num-seqs 1: the batch-1 decode GEMV, as `bench -b 1` measures)
if has 1 && ds 1; then
  load 40 $q q4g64 $P512 --max-concurrency 1 --num-prompts 12 --max-duration 25
  stop
fi
# 8 and 64 streams on one deployment for 64
if (has 8 || has 64) && ds 64; then
  has 8 && load 50 $q q4g64 $P512 --max-concurrency 8 --num-prompts 64 --max-duration 25
  has 64 && load 90 $q q4g64 $P512 --max-concurrency 64 --num-prompts 256 --max-duration 45
  stop
fi
# 256 streams, generation-heavy (vLLM's H200 figure for this model: 12,259 total tok/s, FP8 weights)
if has 256 && ds 256 --max-model-len 4096; then
  load 150 $q q4g64 --input-len 1000 --output-len 2000 --max-concurrency 256 --num-prompts 200
  stop
fi
# llama.cpp's llama-server with the same generator (optional)
if [ -n "${LLAMA_SERVER:-}" ] && [ -n "${GGUF:-}" ]; then
  if start llama "$LLAMA_SERVER" -m "$GGUF" -ngl 99 -fa on --parallel 64 -c $((64 * 1024)) --port $PORT; then
    for c in 1 8 64; do
      load 60 $q q4_k_m $P512 --max-concurrency $c --num-prompts $((c * 4 > 12 ? c * 4 : 12)) --max-duration 25 \
        --engine-label llama.cpp --notes "llama-server --parallel 64 -fa on"
    done
    stop
  fi
fi
echo "done ($((SECONDS-t0)) s)"; ls "$OUT"/*.jsonl 2>/dev/null

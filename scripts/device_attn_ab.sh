# The decode attention device calls' in-model A/B, sourced after device_env.sh (needs $OUT, $t0):
#   attn_default_vs_pick SWEEP BENCH_TIMEOUT PICK_TIMEOUT BENCH_ARGS...
# per cache kind (auto = bf16, fp8): `deltaserve bench BENCH_ARGS` with the library's launch shape, then with the
# pick of scripts/bench_attention_pick.py from the sweep records SWEEP; logs $OUT/bench_<kv>_{default,pick}.log,
# prints the tg rows of each.
attn_default_vs_pick() {
  local sweep=$1 t_bench=$2 t_pick=$3; shift 3
  local KV K
  for KV in auto fp8; do
    K=$([ $KV = fp8 ] && echo fp8 || echo bf16)
    timeout "$t_bench" python3 -m deltaserve bench "$@" --kv-cache-dtype $KV > "$OUT/bench_${KV}_default.log" 2>&1
    echo "== kv $KV, default ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve.*tg" "$OUT/bench_${KV}_default.log" | sort -u
    timeout "$t_pick" python3 scripts/bench_attention_pick.py "$sweep" --kv $K -- "$@" --kv-cache-dtype $KV \
      > "$OUT/bench_${KV}_pick.log" 2>&1
    echo "== kv $KV, $(grep '^pick' "$OUT/bench_${KV}_pick.log") ($((SECONDS-t0)) s)"
    grep -E "^\| deltaserve.*tg" "$OUT/bench_${KV}_pick.log" | sort -u
  done
}

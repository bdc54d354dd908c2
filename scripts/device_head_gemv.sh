#!/usr/bin/env bash
# Device call: the output head on the tensor-core GEMV (DELTASERVE_DECODE_GEMV=head: the lm_head alone through
# kernels/quant/mma_gemv.py, everything else on the CUDA-core default) against the default at B = 1, 8, 64, and the
# bf16 decode attention's strided split programs (DECODE_PROGRAMS 264, 1 or 3 stages) in the model at d512 and
# d32768; then the default's per-kernel profile of a B=1 step. GPU tests first: the head mode end to end on the q4
# tiny model (paths in use, vs the CPU reference, batch invariance, graph == eager) and the fp8 attention at the
# new 8-warp default and the old 4. No records (the default changes only after the A/B).  ~450 s
# Usage (H200 machine, repo root): bash scripts/device_head_gemv.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
timeout 170 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_model_mma_path.py \
  tests/gpu/test_kv_fp8_gpu.py -k "head or test_attention" > "$OUT/tests.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
grep -E "^FAILED|^E  " "$OUT/tests.log" | head -8
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -n 128 -r 3 --no-record"
for v in cuda head; do
  DELTASERVE_DECODE_GEMV=$v timeout 150 python3 -m deltaserve bench $M -d 512 -b 1,8,64 > "$OUT/bench_gemv_$v.log" 2>&1
  echo "== decode GEMV $v ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve.*tg" "$OUT/bench_gemv_$v.log" | sort -u
  grep -iE "weights|GiB" "$OUT/bench_gemv_$v.log" | head -2
done
A="-d 512,32768 -b 1"
for s in "" "DECODE_PROGRAMS=264" "DECODE_PROGRAMS=264;DECODE_STAGES={'bf16':3,'fp8':1}"; do
  args=(); IFS=';' read -ra kv <<< "$s"; for x in "${kv[@]}"; do args+=(--set "$x"); done
  log="$OUT/bench_attn_$(echo "${s:-default}" | tr -c 'A-Za-z0-9' _).log"
  if [ -z "$s" ]; then timeout 60 python3 -m deltaserve bench $M $A > "$log" 2>&1
  else timeout 60 python3 scripts/bench_attention_pick.py "${args[@]}" -- $M $A > "$log" 2>&1; fi
  echo "== attention ${s:-default} ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve.*tg" "$log" | sort -u
done
timeout 90 python3 -m deltaserve bench $M -n 32 -r 1 -d 512 -b 1 --profile > "$OUT/profile_b1.log" 2>&1
echo "== profile B=1 d512 ($((SECONDS-t0)) s)"; grep -A40 "decode step profile" "$OUT/profile_b1.log" | cut -c1-110 | head -40

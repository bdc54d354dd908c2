#!/usr/bin/env bash
# Device call (prepared, not yet run): the checks that making the tensor-core MoE the default needs. The engine's
# graph tests (decode buckets, prefill chunk graphs == eager, bit for bit) on a q4 g64 model under DELTASERVE_MOE=mma
# (the bf16 model of those tests cannot take the mode), the "mma-moe" mode (tensor-core MoE, default GEMVs) end to end
# against the CPU reference, then the records in that mode (their notes name the knob).  ~520 s
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_mma_default.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests 220 tests/gpu/test_engine_graph_gpu.py tests/gpu/test_model_mma_path.py -k "q4-mma-moe or mma-moe"
M="--preset qwen3.6-35b-a3b --quant q4"
DELTASERVE_MOE=mma timeout 150 python3 -m deltaserve bench $M -p 512 -n 128 -d 0,512,4096,8192,32768 -b 1 -r 5 \
  --results "$OUT" 2>&1 | grep -v Warn > "$OUT/bench_b1.log"
DELTASERVE_MOE=mma timeout 120 python3 -m deltaserve bench $M -p 512 -n 128 -d 512 -b 64,8 -r 3 --results "$OUT" 2>&1 \
  | grep -v Warn > "$OUT/bench_b64.log"
echo "== records, DELTASERVE_MOE=mma ($((SECONDS-t0)) s)"; grep -hE "^\| deltaserve" "$OUT"/bench_b*.log | sort -u

#!/usr/bin/env bash
# Device call: the wave's final code tested and profiled. GPU tests: the router rows bit for bit at the default
# Gluon shape (8 x 16) and the others (the last call's window cut it), the tensor-core model paths and the engine's
# graphs (CPU reference whole and chunked, batch invariance, graph == eager); then the prefill profile at 8 prompts
# (4,096 tokens), for where the time goes now. No change measured.  ~400 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_final31.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_kernels_gpu.py -k "test_moe_router_rows"
gpu_tests 150 tests/gpu/test_model_mma_path.py tests/gpu/test_engine_graph_gpu.py
for b in 8; do
  timeout 100 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 0 -b $b -r 2 \
    --profile-prefill > "$OUT/pp_prof$b.log" 2>&1; echo "profile B=$b rc $?"
  grep -E "^ +[0-9.]+ ms +[0-9]+x  _|prefill profile" "$OUT/pp_prof$b.log" | head -24
done
logs_into_one
echo "done ($((SECONDS-t0)) s)"

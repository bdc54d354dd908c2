#!/usr/bin/env bash
# Device call: the expert-tile scan in blocks of counts and the sectioned prefill conv (q, k, v contiguous, so
# fla-core copies nothing). GPU tests (the conv sections and expert tiles against their references, the q4 model on
# the tensor-core paths against the CPU reference, whole and chunked, and the prefill graphs), then pp512 at B=1 and
# B=8 and the prefill profile.  ~330 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_pp
TESTS_NAMED=1 gpu_tests 170 tests/gpu/test_kernels_gpu.py -k "conv or expert_tiles" tests/gpu/test_model_mma_path.py \
  tests/gpu/test_engine_graph_gpu.py
bench_pp "scan + sections" 1
bench_pp "scan + sections" 8
bench_pp "scan + sections again" 1
timeout 150 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 0 -d 0 -b 1 -r 3 --no-record \
  --profile-prefill > "$OUT/prefill_mma.log" 2>&1
echo "== prefill profile ($((SECONDS-t0)) s)"; sed -n '/top kernels/,/top host/p' "$OUT/prefill_mma.log" | cut -c1-130
echo "done ($((SECONDS-t0)) s)"

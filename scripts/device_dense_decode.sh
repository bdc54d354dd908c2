#!/usr/bin/env bash
# (No longer runs on main: the "dense" mode was removed after this call's measurement; it needs the tree at 28cac9e.)
# The "dense" deployment mode (bf16 copies of the mixers' projections, kernels/quant/dense_decode.py) in the model
# (~6 min on a warm Triton cache): its GPU tests (the kernel against dense_mm's prefill rows and its conv epilogue
# against the matmul then causal_conv at the 35B shapes; the tiny q4 model's "dense" mode: copies in use, against
# the CPU reference, batch invariance, graph == eager), then tg64 @ d512 at 64 streams: mma (the default) / dense
# (the conv in the matmul's epilogue) / dense with the conv as its own launch / mma again; then 16 streams.
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_dense_decode.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_kernels_gpu.py -k dense_decode
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_model_mma_path.py -k dense
mem() { grep -h "peak GPU" "$OUT/bench.log" | cut -c1-160; cp "$OUT/bench.log" "$OUT/bench_$1.log"; }
bench_tg "mma" 64 64; mem mma64
bench_tg "dense" 64 64 DELTASERVE_DECODE_GEMV=dense; mem dense64
bench_tg "dense, conv launch" 64 64 DELTASERVE_DECODE_GEMV=dense DELTASERVE_DECODE_CONV=kernel
bench_tg "mma, conv launch" 64 64 DELTASERVE_DECODE_CONV=kernel
bench_tg "mma" 64 64
bench_tg "dense" 64 64 DELTASERVE_DECODE_GEMV=dense
bench_tg "mma" 16 64
bench_tg "dense" 16 64 DELTASERVE_DECODE_GEMV=dense
logs_into_one
echo "done ($((SECONDS-t0)) s)"

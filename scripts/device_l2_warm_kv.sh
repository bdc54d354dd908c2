#!/usr/bin/env bash
# (Ran in wave 43 on an H100 at 3aaca3f / 6a9d7da: the L2 warm lost in every form and was removed after it, so this
# script no longer runs on main; bench/NOTES.md wave 43 has its numbers.)
# The L2 warm in the model, and its K/V form. DELTASERVE_L2_WARM: next = the batch-1 gate/up launch touches the next
# layer's input projection; all = and the DeltaNet step its out projection. DELTASERVE_L2_WARM_KV=MB: the gate/up
# launch before an attention layer touches that layer's first MB of the row's cached K/V too.
# (1) tg64 @ d512 B=1, off / all / next alternating; (2) tg64 @ d32768 B=1 under all, K/V 0 / 32 alternating;
# (3) the GPU tests (-k l2_warm: the block, the step, the model's same bits with each form).
# Predicted: next +2%, all +3% @ d512; K/V 32 MB @ d32768: the split kernel reads half its 64 MB a layer from the
# L2, 22.9 -> ~15 us: +4-5%.  Usage (H200 machine, repo root; carry .whl, .tcache.tgz):
#   bash scripts/device_l2_warm_kv.sh      (~500 s on a warm Triton cache)
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
left() { echo $((${BUDGET:-570} - (SECONDS - t0))); }  # seconds left of the call
for mode in ${MODES:-off all next off all next}; do bench_tg "warm=$mode d512" 1 64 DELTASERVE_L2_WARM=$mode; done
d32k() {
  BENCH_ARGS="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 32768" BENCH_TIMEOUT=100 \
    bench_tg "warm=all kv=$1 d32768" 1 64 DELTASERVE_L2_WARM=all DELTASERVE_L2_WARM_KV=$1
}
d32k 0; d32k 32
TESTS_NAMED=1 gpu_tests 140 tests/gpu/test_mma_gemv_gpu.py tests/gpu/test_kernels_gpu.py \
  tests/gpu/test_model_mma_path.py -k "l2_warm"
for kv in 0 32; do [ "$(left)" -gt 110 ] && d32k $kv; done
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

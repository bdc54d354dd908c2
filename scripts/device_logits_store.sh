#!/usr/bin/env bash
# Device call (measured; the fp32 store is the default since be12011): the two torch launches left outside the
# layers at decode. The gather before the final norm is gone by default (ForwardBatch.logits_all_rows, ecae135); the lm_head's fp32 store
# (DELTASERVE_LOGITS_STORE=fp32, 5cdd748) against bf16 then .float(). GPU tests first (fp32 out == bf16 widened,
# the q4 model's logits equal under both stores, eager and graph; the fast-path model's graph == eager and batch
# invariance with the gather skipped), then tg128 @ d512 B=1 (twice) and B=64 for each store.  ~330 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
gpu_tests 170 tests/gpu/test_mma_gemv_gpu.py tests/gpu/test_model_mma_path.py tests/gpu/test_model_fast_path.py \
  -k "fp32_out or logits_stored or batch_invariance_bit or graph_replay"
for rep in 1 2; do
  bench_tg "logits bf16" 1 128 DELTASERVE_LOGITS_STORE=bf16
  bench_tg "logits fp32" 1 128 DELTASERVE_LOGITS_STORE=fp32
done
bench_tg "logits bf16" 64 32 DELTASERVE_LOGITS_STORE=bf16
bench_tg "logits fp32" 64 32 DELTASERVE_LOGITS_STORE=fp32

#!/usr/bin/env bash
# Device call: the batch-1 decode attention's settled form (DELTASERVE_ATTN_KV_EARLY=1): the split programs request
# the K rows of every position but a row's newest before their PDL wait (earlier forwards wrote them; each forward
# starts without PDL), q, the newest K row and V after it. GPU tests: the kernel's bits (settled == plain, into a
# poisoned output), the race test (writers that open the next launch at once and write each row's newest K/V and q
# after a ~100 us spin must be seen), then that test against a mutated kernel that never re-reads the newest K row
# (it must FAIL, or the test proves nothing), the models end to end with the form on (bf16 fast path: CPU
# reference, batch invariance, graph == eager, PDL == serial; the q4 mma-moe mode). Then batch 1 at d512 and d32768
# each way (ABBA), and a graph profile of batch 1 at d512 with the form on (kernels named per grid).
# Prediction: the split kernel's critical time 7.41 -> ~5 us a layer at d512 (+1.5%), at 32K -2-3 us a layer (+1.5%).
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_kv_early.sh  ~480 s
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 90 tests/gpu/test_kernels_gpu.py -k "paged_attention or settled or decode_attention_gate"
f=deltaserve/kernels/attention/triton_paged.py
cp $f /tmp/tp_keep.py
sed -i 's/    new = valid \& (pos == L - 1)/    new = valid \& (pos == -7)/' $f
grep -c 'pos == -7' $f
TESTS_NAMED=1 gpu_tests 60 tests/gpu/test_kernels_gpu.py -k "settled_reads"
echo "(the mutated run above must show FAILED)"
cp /tmp/tp_keep.py $f
DELTASERVE_ATTN_KV_EARLY=1 TESTS_NAMED=1 gpu_tests 150 tests/gpu/test_model_fast_path.py tests/gpu/test_model_mma_path.py \
  -k "test_bf16_gpu_matches_cpu_reference or test_batch_invariance or test_graph_replay or test_pdl_equals or (mma-moe] and (invariance or graph))"
for v in 0 1 1 0; do bench_tg "kv early $v" 1 64 DELTASERVE_ATTN_KV_EARLY=$v; done
BENCH_ARGS="--preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 --no-record -d 32768" BENCH_TIMEOUT=120
for v in 0 1 1 0; do bench_tg "kv early $v d32768" 1 64 DELTASERVE_ATTN_KV_EARLY=$v; done
DELTASERVE_ATTN_KV_EARLY=1 timeout 120 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 -r 1 \
  --no-record -d 512 -b 1 -n 32 --profile-graph > "$OUT/graph_b1.log" 2>&1
grep -A40 'decode graph profile' "$OUT/graph_b1.log" | head -45
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the tensor-core MoE's combining down launch making the next layer's input norm (and the final norm)
# at each token's last combining program (DELTASERVE_NEXT_NORM=down; every plain norm then on the pairwise tree, so
# the same bits whichever kernel makes it). GPU tests: the kernel's norm against the rms_norm launch bit for bit
# (T = 1 / 3 / 14, N = 2048 / 64 / 1536) and the GEMV prep made with it (xp, xs), the combine test, the q4 model in every tensor-core mode (down == the
# launch with the tree, eager and graph; made at 1 and 3 rows) and mma-moe's invariance and graph == eager; then
# batch 1 at d512 both ways (ABBA) and a graph profile with it. Prediction: the norm's 1.78 us of critical time
# a layer against ~1.2-1.4 us more in down's tail (an atomic and a row's read, one program): +1-1.5%. (The first
# call found the input norms making their GEMV's prep, which down did not make yet: nothing was fused, and the
# plain norms' tree alone cost 672.3 -> 665.6.)  ~300 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_next_norm.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 80 tests/gpu/test_mma_gemv_gpu.py -k "next_norm or combine_at_last_arrival"
TESTS_NAMED=1 gpu_tests 170 tests/gpu/test_model_mma_path.py \
  -k "next_norm or (mma-moe] and (batch_invariance or graph_replay))"
for v in launch down down launch; do bench_tg "next norm $v" 1 64 DELTASERVE_NEXT_NORM=$v; done
timeout 90 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 -r 1 --no-record -d 512 -b 1 \
  -n 32 --profile-graph > "$OUT/graph_d512.log" 2>&1
grep -A24 'decode graph profile' "$OUT/graph_d512.log" | cut -c1-110
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: down with several sets of 64 weight rows a program (wg_matmul_experts(row_sets=), the sets as one
# stream of steps: the next set's first groups in flight while a set finishes, the tile, order and x rows looked up
# once a program). GPU test (the same bits as one set and as mma.sync), then tg64 at 64 streams with 1 / 2 / 4 sets
# (DELTASERVE_MOE_WGMMA_DOWN_SETS, 8-row tiles), and pp512 B=1 with 2 sets for every tile width.
# Prediction: down's 53 us (55% of DRAM) -> ~45 at 4 sets: 64 streams +3%; pp512 +1%.  ~330 s
# Usage (H200 machine, repo root; carry .whl, .tcache.txz, .tcache.tgz): bash scripts/device_down_sets.sh
source "$(dirname "$0")/device_env.sh"
TESTS_NAMED=1 gpu_tests 170 tests/gpu/test_wgmma_experts_gpu.py -k "row_sets"
for v in 1 4 2 4 1; do bench_tg "down sets $v" 64 64 DELTASERVE_MOE_WGMMA_DOWN_SETS=$v@8; done
for v in 1 2; do bench_pp "down sets $v" 1 DELTASERVE_MOE_WGMMA_DOWN_SETS=$v; done
logs_into_one
cache_news
echo "done ($((SECONDS-t0)) s)"

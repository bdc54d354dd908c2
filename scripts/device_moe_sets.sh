#!/usr/bin/env bash
# Wave 46: the MoE's expert tiles as two sets (even and odd tiles) on two streams in the model (fast.moe_fork,
# moe_block_mma(fork=), wg_matmul_experts(tile_set=)): the kernel's and the model's bit tests, the probe with the
# model's form beside the expert-range sets, then tg64 @ d512 at 64 streams forked / joint twice each, then 32
# streams on the warpgroup-MMA kernel (from 288 rows) forked and joint against today's mma.sync default.
# Usage (any H100 / H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_moe_sets.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_wgmma_experts_gpu.py -k tile_sets tests/gpu/test_model_mma_path.py
timeout 90 python3 scripts/probe_moe_halves.py > "$OUT/moe_halves64.log" 2>&1; echo "probe rc $?"
tail -7 "$OUT/moe_halves64.log"
export BENCH_TIMEOUT=150
bench_tg "sets" 64 64
bench_tg "joint" 64 64 DELTASERVE_MOE_HALVES=0
bench_tg "sets" 64 64
bench_tg "joint" 64 64 DELTASERVE_MOE_HALVES=0
bench_tg "default (mma.sync)" 32 64
bench_tg "wg joint" 32 64 DELTASERVE_MOE_WGMMA_MIN_ROWS=288 DELTASERVE_MOE_HALVES=0
bench_tg "wg sets" 32 64 DELTASERVE_MOE_WGMMA_MIN_ROWS=288 DELTASERVE_MOE_HALVES=32
logs_into_one
echo "done ($((SECONDS-t0)) s)"

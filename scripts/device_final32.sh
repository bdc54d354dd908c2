#!/usr/bin/env bash
# Device call: the GPU tests at the wave's final code: the MoE block on the wgmma kernel == mma.sync at 3 / 300 /
# 512 / 1,024 tokens (8-, 16- and 32-row tiles at the defaults), the row sets, the plain form against fp64, the
# input checks; the probe once through bench.graph_capture (the review's change); the engine's graphs (window).
# ~250 s.  Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_final32.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
TESTS_NAMED=1 gpu_tests 130 tests/gpu/test_wgmma_experts_gpu.py -k \
  "test_moe_block_wgmma_same_bits or test_wg_row_sets or test_wg_experts_input_checks or test_wg_experts_plain"
timeout 40 python3 scripts/probe_prefill_experts.py --t 512 --gs default --gated-ns 3 --down-ns 3 --sets 1,2 \
  > "$OUT/probe.log" 2>&1; echo "probe rc $? ($((SECONDS-t0)) s)"; grep -E "^\|" "$OUT/probe.log" | tail -4
TESTS_NAMED=1 gpu_tests 80 tests/gpu/test_engine_graph_gpu.py
logs_into_one
echo "done ($((SECONDS-t0)) s)"

#!/usr/bin/env bash
# Device call: the probe's A/B of the split wait and the 168 cap at 32-row tiles (the records call's probe, whose
# --env with a comma list the parser had refused), then the tensor-core model paths and the engine's graphs at the
# fold defaults (window). ~230 s.  Usage (H200 machine, repo root; carry .whl, .tcache.tgz): bash scripts/device_fold3.sh
source scripts/device_env.sh
timeout 50 python3 scripts/probe_prefill_experts.py --t 512,4096 --gs default --gated-ns 3 --down-ns "" --env base:DELTASERVE_WGMMA_SPLIT_WAIT=0 --env split:DELTASERVE_WGMMA_SPLIT_WAIT=1 --env cap168@32:DELTASERVE_WGMMA_MAXNREG=96@8,128@16,168@32 --out "$OUT/probe.jsonl" > "$OUT/probe.log" 2>&1; echo "probe rc $?"; grep -E "^\|" "$OUT/probe.log"
TESTS_NAMED=1 gpu_tests 200 tests/gpu/test_model_mma_path.py tests/gpu/test_engine_graph_gpu.py
logs_into_one

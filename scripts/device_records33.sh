#!/usr/bin/env bash
# Device call: the records at the fold and the 96@8,128@16 register caps (the new defaults), then the tensor-core
# model paths and the engine's graphs at them (window). Predictions from the same-call A/Bs: pp512 B=1 ~24,400 @ d512
# (+1.9% on 23,988), 8 prompts ~38,200 (+1%), 64 prompts ~37,400, 64 streams ~6,110, batch-1 decode unchanged.
# ~500 s.  Usage (H200 machine, repo root; carry .whl, .tcache.tgz): DELTASERVE_COMMIT=<sha> bash scripts/device_records33.sh
source "$(dirname "$0")/device_env.sh"
python3 -c "import fla" || { echo "fla missing: stop"; exit 1; }
# first an A/B of the gated step's split wait (gate's FMAs while up's MMAs run; DELTASERVE_WGMMA_SPLIT_WAIT, off):
# predicted ~-3% for the gated launch at 512 tokens (the MMA latency of each step's second weight hidden)
timeout 50 python3 scripts/probe_prefill_experts.py --t 512,4096 --gs default --gated-ns 3 --down-ns "" \
  --env base:DELTASERVE_WGMMA_SPLIT_WAIT=0 --env split:DELTASERVE_WGMMA_SPLIT_WAIT=1 \
  --env cap168@32:DELTASERVE_WGMMA_MAXNREG=96@8,128@16,168@32 \
  --out "$OUT/probe.jsonl" > "$OUT/probe.log" 2>&1; echo "probe rc $? ($((SECONDS-t0)) s)"; grep -E "^\|" "$OUT/probe.log"
TESTS_NAMED=1 gpu_tests 60 "tests/gpu/test_wgmma_experts_gpu.py::test_wg_experts_same_bits_as_mma[512]"
echo "== records at ${DELTASERVE_COMMIT:-?}"
bench_records 170 125
TESTS_NAMED=1 gpu_tests 60 tests/gpu/test_model_mma_path.py tests/gpu/test_engine_graph_gpu.py
logs_into_one
echo "done ($((SECONDS-t0)) s)"

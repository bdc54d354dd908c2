#!/usr/bin/env bash
# Device call (prepared, not yet run): the GPU tests this wave's last call did not reach (the DeltaNet step's prep
# end to end on the dv = 64 q4 model: step vs launch logits, batch invariance 1/3/15/63, graph == eager; the head
# and mma modes on the dv = 16 model), then the tensor-core experts kernel at T = 1 and 64 with each call's experts
# past the L2 (scripts/sweep_mma_gemv.py --experts, 16 routings per graph) and the two MoE blocks (--moe), to see
# where the tensor-core MoE's batch-1 gap (558 vs 601 tok/s in the model) lies.  ~450 s
# Usage (H200 machine, repo root): bash scripts/device_prep_experts.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
timeout 240 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_model_mma_path.py \
  > "$OUT/tests.log" 2>&1
echo "tests ($((SECONDS-t0)) s): $(grep -E 'passed|failed' "$OUT/tests.log" | tail -1)"
grep -E "^FAILED|^E  " "$OUT/tests.log" | head -12
timeout 180 python3 scripts/sweep_mma_gemv.py --experts --ms 1,64 --budget-s 150 --out "$OUT/sweep_experts.jsonl" \
  > "$OUT/sweep_experts.log" 2>&1
echo "== experts kernel, routings past the L2 ($((SECONDS-t0)) s)"; grep -E "experts_" "$OUT/sweep_experts.log" | cut -c1-150
timeout 100 python3 scripts/sweep_mma_gemv.py --moe --ms 1,8,64 --budget-s 80 --out "$OUT/sweep_moe.jsonl" > "$OUT/sweep_moe.log" 2>&1
echo "== MoE blocks ($((SECONDS-t0)) s)"; grep -E "moe_" "$OUT/sweep_moe.log" | cut -c1-150

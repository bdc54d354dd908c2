#!/usr/bin/env bash
# Device call: the tensor-core experts kernel at a 512-token prefill with more chunks in flight. The kernel is
# latency-bound per program there (ncu, 2026-12-01: 5 programs of 4 warps an SM, 9 cycles an instruction), and its
# prefill configuration keeps 2 chunks in flight in registers; the register ring (3 .. 7 chunks) and the whole
# slice (8: x staged in shared memory) were tuned at one token only and never timed at 512. (1) scripts/
# sweep_mma_gemv.py --experts at T = 512 and 64 over AHEAD (each configuration bit-equal to the first and within
# fp64 tolerance); (2) ncu's SASS source page for the default gated and scaled forms at T = 512
# (scripts/device_experts_source.sh without its graph profiles).  ~300 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
timeout 200 python3 scripts/sweep_mma_gemv.py --experts --ms 512,64 --aheads 2,3,4,5,7,8 --loops "" \
  --own-xs loaded --budget-s 170 --out "$OUT/sweep.jsonl" > "$OUT/sweep.log" 2>&1
echo "== sweep ($((SECONDS-t0)) s)"; grep -vE "^\s*$" "$OUT/sweep.log" | tail -30 | cut -c1-160
GRAPH_MODES= bash "$(dirname "$0")/device_experts_source.sh"
echo "done ($((SECONDS-t0)) s)"

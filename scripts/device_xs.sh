#!/usr/bin/env bash
# Device call (run 2026-12-01, bench/NOTES.md): x's group sums staged in shared memory in the warpgroup-MMA kernels
# (DELTASERVE_WGMMA_XS=smem, wgmma_experts.wg_xs_smem; off by default). sm_90 SASS compiled without a GPU
# (bench/NOTES.md): a step of the 32-row dense form 209 -> 169 instructions (the 8 LDGs of the sums and their 64-bit
# addresses gone), 166 -> 161 registers; the 16-row dense form 141 -> 107 registers (4 programs an SM instead of 3);
# the 64-row dense form 255 registers + 184 bytes of stack -> 251 + 0; the MoE's 8-row gated form (5 slots, 128
# registers) 3,792 -> 3,624 instructions, 32 -> 8 bytes of stack; its 16-row form (prefill) 165 -> 150 registers,
# a step 232 -> 205; with the slots carried too (DELTASERVE_WGMMA_SLOTS=carry: no step % NS division) the 32-row
# dense step 169 -> 152 and 161 -> 138 registers, the 8-row gated form 110 registers without a cap (but its
# partly unrolled ~130-instruction steps become ~165-instruction loop steps: it may lose). (1) GPU tests: the staged sums == the loads bit for bit (MoE gate/up at 64 and 512 tokens,
# wg_gemv over shapes, rows, tiles), the tiny q4 model with every wgmma path and the staging on (CPU reference,
# batch invariance, graphs); (2) the probe: wg_gemv load vs smem on the in_proj and the lm_head at 32 / 64 rows,
# 16-, 32- and 64-row tiles (predicted in_proj at 64 rows 25.7 -> ~21 us, at 32 rows 15.1 -> ~12; lm_head at 64
# rows ~470 -> ~390); (3) in the model, alternating: tg64 @ d512 at 64 streams, staged sums (predicted +2-4%) and
# staged + carried slots (+1-2% more, or less if the MoE's unrolled steps mattered). The prefill A/B is
# scripts/device_xs_pp.sh.  ~540 s from a cold Triton cache
# Usage (H200 machine, repo root): bash scripts/device_xs.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg, bench_pp
TESTS_NAMED=1 gpu_tests 130 tests/gpu/test_wgmma_experts_gpu.py -k "xs_smem"
TESTS_NAMED=1 gpu_tests 80 tests/gpu/test_model_mma_path.py -k "wg and xs"
timeout 90 python3 scripts/probe_wg_gemv.py --shapes 0,2 --ms 32,64 --bn 16,32,64 --ns 3 --xs load,smem \
  --out "$OUT/probe.jsonl" > "$OUT/probe.log" 2>&1
echo "== probe ($((SECONDS-t0)) s)"; grep -E "^\||differ|DIFFER" "$OUT/probe.log" | tail -30
BENCH_TIMEOUT=150 bench_tg default 64 64
for cfg in "DELTASERVE_WGMMA_XS=smem" "DELTASERVE_WGMMA_XS=smem DELTASERVE_WGMMA_SLOTS=carry" "" "DELTASERVE_WGMMA_XS=smem"; do
  bench_tg "${cfg:-default}" 64 64 $cfg
done
tar czf "$OUT/tcache.tgz" -C /tmp tcache && split -b 15M "$OUT/tcache.tgz" "$OUT/tcache.tgz." && rm "$OUT/tcache.tgz"
echo "done ($((SECONDS-t0)) s)"

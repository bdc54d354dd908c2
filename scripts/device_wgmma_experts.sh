#!/usr/bin/env bash
# Device call: the experts matmul on warpgroup MMAs (kernels/quant/wgmma_experts.py) against the mma.sync experts
# kernel: bit equality (every tile width, both orders of the warps' partial sums) and eager timings at 512 / 4096 /
# 64 tokens over tile widths and shared-memory slots (scripts/probe_wgmma_experts.py).  ~300 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, bench_pp, bench_tg
timeout 330 python3 scripts/probe_wgmma_experts.py --t 512,4096,64 --bn 8,16 --ns 2,3,4 --out "$OUT/probe.jsonl" \
  > "$OUT/probe.log" 2>&1
echo "== probe ($((SECONDS-t0)) s)"; grep -E "differing|Error|error" "$OUT/probe.log" | cut -c1-160; grep -E "^\|" "$OUT/probe.log"
tar czf "$OUT/tcache.tgz" -C /tmp tcache && echo "triton cache packed: $(du -h "$OUT/tcache.tgz" | cut -f1)"
echo "done ($((SECONDS-t0)) s)"

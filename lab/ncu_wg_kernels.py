"""Driver for Nsight Compute over the warpgroup-MMA kernels at a 64-stream decode's sizes (lab/device_wg_ncu.sh):
the DeltaNet in_proj (12352 x 2048, q4 g64) at 64 rows through mma_gemv's own kernel and wg_gemv (32-row tiles with 3
and 8 slots, 16-row tiles with 3), then the MoE's gated gate/up and scaled down on the wgmma experts kernel at 64
tokens (8-row tiles, as a 64-stream decode runs them). Each launch first once to compile (and a sync), then once to
measure, in the same order: the measured launches are the 7th to the 12th of these kernels. --experts-only: the MoE's
two launches alone, at the model's slots for 8-row tiles (wg_moe_stages) and its groups a step (wg_step_groups, env
DELTASERVE_MOE_WGMMA_GROUPS): the measured launches are the 3rd and 4th. --prefill T: the MoE's two launches at T
tokens as the model's prefill runs them (wg_tile_rows' tiles, wg_moe_stages / wg_moe_down_stages' slots), each on
a routing and input of its own: again the 3rd and 4th.

  python lab/ncu_wg_kernels.py [--experts-only | --prefill T]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    os.environ["DELTASERVE_MMA_GEMV_WG_ROWS"] = "0"  # mma_gemv: its own kernel
    from kernel_cases import affine_weight
    from probe_moe_t1 import NUM_E, SLOTS, expert_stacks, probe_inputs

    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import wgmma_experts as wx

    dev = torch.device("cuda")
    torch.manual_seed(0)
    p, s, b, _ = affine_weight((12352, 2048), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    x = (torch.randn(64, 2048, device=dev) * 0.5).bfloat16()
    xs = x.float().view(64, 32, 64).sum(-1)
    gate, up, down = expert_stacks(dev)
    routes, xin, sums, hs, scale = probe_inputs(dev, 64, 1)
    tiles = mg.mma_expert_tiles(routes[0], NUM_E, 8)
    # each call takes the index of its input; all but --prefill's have one input, used to warm and to measure
    measured = 0
    calls = [
        ("mma_gemv 64 rows", lambda j: mg.mma_gemv(x, words, sb, xs=xs)),
        ("wg_gemv BN 32 NS 3", lambda j: wx.wg_gemv(x, words, sb, xs=xs, tile_rows=32, stages=3)),
        ("wg_gemv BN 32 NS 8", lambda j: wx.wg_gemv(x, words, sb, xs=xs, tile_rows=32, stages=8)),
        ("wg_gemv BN 16 NS 3", lambda j: wx.wg_gemv(x, words, sb, xs=xs, tile_rows=16, stages=3)),
        ("wg experts gated T=64", lambda j: wx.wg_matmul_experts(xin[0], *gate, routes[0], tiles, SLOTS, xs=sums[0],
                                                                 up=up)),
        ("wg experts down T=64", lambda j: wx.wg_matmul_experts(hs[0], *down, routes[0], tiles, 1, scale=scale)),
    ]
    if "--experts-only" in sys.argv[1:]:
        ns = wx.wg_moe_stages(8)
        calls = [("wg experts gated T=64 (model slots)", lambda j: wx.wg_matmul_experts(
                     xin[0], *gate, routes[0], tiles, SLOTS, xs=sums[0], up=up, stages=ns)),
                 ("wg experts down T=64 (model slots)", lambda j: wx.wg_matmul_experts(
                     hs[0], *down, routes[0], tiles, 1, scale=scale, stages=ns))]
    if "--prefill" in sys.argv[1:]:
        t = int(sys.argv[sys.argv.index("--prefill") + 1])
        routes, xin, sums, hs, scale = probe_inputs(dev, t, 2)
        bn = wx.wg_tile_rows(t * SLOTS)
        tl = [mg.mma_expert_tiles(r, NUM_E, bn) for r in routes]
        ns, nsd = wx.wg_moe_stages(bn), wx.wg_moe_down_stages(bn)
        calls = [(f"wg experts gated T={t} (model slots)", lambda j: wx.wg_matmul_experts(
                     xin[j], *gate, routes[j], tl[j], SLOTS, xs=sums[j], up=up, stages=ns)),
                 (f"wg experts down T={t} (model slots)", lambda j: wx.wg_matmul_experts(
                     hs[j], *down, routes[j], tl[j], 1, scale=scale, stages=nsd))]
        measured = 1  # warmed on the first routing, measured on the second (its experts from DRAM)
    for _, fn in calls:  # compile and warm
        fn(0)
    torch.cuda.synchronize()
    for name, fn in calls:
        print(f"measured launch: {name}", flush=True)
        fn(measured)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

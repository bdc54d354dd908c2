"""The experts matmul at prefill sizes on warpgroup MMAs (kernels/quant/wgmma_experts.py) against the mma.sync
experts kernel (mma_gemv.mma_matmul_experts, the default configuration and 8-row tiles), at the 35B-A3B's shapes
(256 routed experts + the shared one stacked last, top-8, H 2048, I 512, q4 g64): bit equality of every form and
(gated with the norm's group sums, down with its own), then eager timings over
--calls routings and inputs of their own (the experts from DRAM, as in the model), one line each, a table last.

  python lab/probe_wgmma_experts.py --t 512,4096,64 --bn 8,16 --ns 3 --orders group,partial [--out results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_moe_t1: the same MoE inputs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--t", default="512,4096,64", help="token counts")
    ap.add_argument("--bn", default="16,32,64", help="rows of x per wgmma tile")
    ap.add_argument("--ns", default="2,3,4", help="shared-memory slots")
    ap.add_argument("--orders", default="group,partial", help="the gated form's group orders (wg partial_major)")
    ap.add_argument("--out", help="append one JSON line per timing here")
    args = ap.parse_args(argv)
    from probe_moe_t1 import NUM_E as num_e, SLOTS as slots, expert_stacks, probe_inputs

    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import wgmma_experts as wx

    dev = torch.device("cuda")
    torch.manual_seed(0)
    gate, up, down = expert_stacks(dev)
    table = []
    for t in (int(v) for v in args.t.split(",")):
        routes, xin, sums, hs, scale = probe_inputs(dev, t, args.calls)
        tiles8 = [mg.mma_expert_tiles(r, num_e, 8) for r in routes]

        def timed(fn):
            fn(0)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for j in range(1, args.calls):
                fn(j)
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) * 1e3 / (args.calls - 1)

        ref_g = mg.mma_matmul_experts(xin[0], *gate, routes[0], slots, xs=sums[0], tiles=tiles8[0], up=up)
        ref_d = mg.mma_matmul_experts(hs[0], *down, routes[0], 1, tiles=tiles8[0], scale=scale)
        rows = [("mma.sync 8-row tiles", "gated", timed(lambda j: mg.mma_matmul_experts(
                    xin[j], *gate, routes[j], slots, xs=sums[j], tiles=tiles8[j], up=up)), "ref"),
                ("mma.sync 8-row tiles", "down", timed(lambda j: mg.mma_matmul_experts(
                    hs[j], *down, routes[j], 1, tiles=tiles8[j], scale=scale)), "ref")]
        os.environ["DELTASERVE_MMA_SKIP_EMPTY"] = "0"  # the unused tail tiles running the K loop, as before
        rows += [("mma.sync 8-row tiles, no skip", "gated", timed(lambda j: mg.mma_matmul_experts(
                    xin[j], *gate, routes[j], slots, xs=sums[j], tiles=tiles8[j], up=up)), "-"),
                 ("mma.sync 8-row tiles, no skip", "down", timed(lambda j: mg.mma_matmul_experts(
                     hs[j], *down, routes[j], 1, tiles=tiles8[j], scale=scale)), "-")]
        del os.environ["DELTASERVE_MMA_SKIP_EMPTY"]
        for bn in (int(v) for v in args.bn.split(",")):
            tiles = [mg.mma_expert_tiles(r, num_e, bn) for r in routes]
            for ns in (int(v) for v in args.ns.split(",")):
                for order in args.orders.split(","):
                    pm = order == "partial"
                    out = torch.full_like(ref_g, float("nan"))
                    got = wx.wg_matmul_experts(xin[0], *gate, routes[0], tiles[0], slots, xs=sums[0], up=up, out=out,
                                               stages=ns, partial_major=pm)
                    diff_g = int((got.view(torch.int16) != ref_g.view(torch.int16)).sum()) + int(got.isnan().sum())
                    print(f"T={t} BN={bn} NS={ns} {order} order: gated differing or NaN elements {diff_g} of "
                          f"{ref_g.numel()}", flush=True)
                    rows.append((f"wgmma BN {bn} NS {ns} {order}", "gated", timed(lambda j: wx.wg_matmul_experts(
                        xin[j], *gate, routes[j], tiles[j], slots, xs=sums[j], up=up, stages=ns, partial_major=pm)),
                        str(diff_g)))
                out = torch.full_like(ref_d, float("nan"))
                got = wx.wg_matmul_experts(hs[0], *down, routes[0], tiles[0], 1, scale=scale, out=out, stages=ns)
                diff_d = int((got.view(torch.int32) != ref_d.view(torch.int32)).sum()) + int(got.isnan().sum())
                print(f"T={t} BN={bn} NS={ns}: down differing or NaN elements {diff_d} of {ref_d.numel()}", flush=True)
                rows.append((f"wgmma BN {bn} NS {ns}", "down", timed(lambda j: wx.wg_matmul_experts(
                    hs[j], *down, routes[j], tiles[j], 1, scale=scale, stages=ns)), str(diff_d)))
        for name, form, us, bits in rows:
            table.append((t, name, form, us, bits))
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps({"probe": "wgmma_experts", "t": t, "kernel": name, "form": form,
                                        "us": round(us, 2), "bits": bits}) + "\n")
    print("\n| T | kernel | form | us | elements differing from mma.sync |\n|---|---|---|---|---|")
    for t, name, form, us, bits in table:
        print(f"| {t} | {name} | {form} | {us:.1f} | {bits} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The dense decode GEMV on warpgroup MMAs (wgmma_experts.wg_gemv) against the tensor-core GEMV (mma_gemv, its
default configuration) at the 35B-A3B's K = 2048 decode linears (q4 g64), for 16 / 32 / 64 rows of x.

Every form is first checked bit for bit against mma_gemv on fresh random weights and rows: the norm's group sums
given (bf16 and fp32 out) and the kernel's own; then timed as a CUDA graph of calls cycling weight copies past the
L2 (sweep_common.time_graph), one line each, a table last.

  python lab/probe_wg_gemv.py [--ms 16,32,64] [--bn 8,16,32,64] [--ns 3,4] [--xs load,smem] [--ks 1,2,4]
                                 [--shapes 0,1,2,3] [--out FILE]

--xs: where wg_gemv reads the norm's group sums from, global memory each step (load) or the tile's sums staged in
shared memory once (smem, wgmma_experts.wg_xs_smem); each form checked against mma_gemv like the others.
--ks: programs a row block's K is split over (wg_gemv(ksplit=)); those a weight's K split cannot take are skipped
(the K = 4096 out projection, shape 3, takes 2, 4 and 8).
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = ((12352, 2048, "DeltaNet in_proj"), (9216, 2048, "attention qkv"), (248320, 2048, "lm_head"),
          (2048, 4096, "out projection"))
L2_BYTES = 256 << 20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ms", default="16,32,64")
    ap.add_argument("--bn", default="8,16,32,64")
    ap.add_argument("--ns", default="3,4")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--out")
    ap.add_argument("--split", action="store_true", help="the K = 4096 out projection's row split too")
    ap.add_argument("--shapes", default="0,1,2", help="indices into SHAPES")
    ap.add_argument("--xs", default="load", help="load and/or smem: wg_gemv's group sums (xs_smem)")
    ap.add_argument("--ks", default="1", help="wg_gemv's K split over programs (ksplit), a comma list")
    args = ap.parse_args(argv)
    from kernel_cases import affine_weight
    from sweep_common import time_graph

    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import wgmma_experts as wx

    os.environ["DELTASERVE_MMA_GEMV_WG_ROWS"] = "0"  # mma_gemv: its own kernel at every row count (the reference)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    bad = 0
    table = []

    def emit(rec: dict) -> None:  # one timing: printed, kept for the table, appended to --out
        print(json.dumps(rec), flush=True)
        table.append(rec)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
    for n, k, name in [SHAPES[int(i)] for i in args.shapes.split(",") if i]:
        p, s, b, _ = affine_weight((n, k), 4, 64, dev)
        words, sb = mg.repack_q4(p, s, b)
        del p, s, b
        nbytes = words.numel() * 4 + sb.numel() * 2
        copies = max(1, min(16, -(-2 * L2_BYTES // nbytes)))
        stacks = [(words, sb)] + [(words.clone(), sb.clone()) for _ in range(copies - 1)]
        for m in (int(v) for v in args.ms.split(",")):
            x = (torch.randn(m, k, device=dev) * 0.5).bfloat16()
            xs = x.float().view(m, k // 64, 64).sum(-1)
            ref = mg.mma_gemv(x, words, sb, xs=xs)
            ref_own = mg.mma_gemv(x, words, sb)
            ref32 = mg.mma_gemv(x, words, sb, xs=xs, out=torch.empty(m, n, device=dev))
            t_mma, how = time_graph([lambda w=w: mg.mma_gemv(x, *w, xs=xs) for w in stacks], dev, args.replays)
            rows = [("mma_gemv", "-", "-", t_mma, True)]
            for bn in (int(v) for v in args.bn.split(",")):
                if bn > 2 * m and bn > 8:
                    continue
                warps = mg.default_warps(k)
                for ns, mode, ks in ((int(v), mode, int(ks)) for v in args.ns.split(",")
                                     for mode in args.xs.split(",") for ks in args.ks.split(",")):
                    if not wx.wg_ksplit_fits(warps, ks):
                        continue
                    sm = {"load": False, "smem": True}[mode]
                    got = wx.wg_gemv(x, words, sb, xs=xs, out=torch.full_like(ref, float("nan")), tile_rows=bn,
                                     stages=ns, xs_smem=sm, ksplit=ks)
                    own = wx.wg_gemv(x, words, sb, out=torch.full_like(ref, float("nan")), tile_rows=bn, stages=ns,
                                     ksplit=ks)
                    g32 = wx.wg_gemv(x, words, sb, xs=xs, out=torch.full_like(ref32, float("nan")), tile_rows=bn,
                                     stages=ns, xs_smem=sm, ksplit=ks)
                    same = torch.equal(got, ref) and torch.equal(own, ref_own) and torch.equal(g32, ref32)
                    if not same:
                        bad += 1
                        print(f"  DIFFER {name} m={m} bn={bn} ns={ns} xs {mode} ks {ks}: given "
                              f"{(got != ref).sum().item()}, "
                              f"own {(own != ref_own).sum().item()}, fp32 {(g32 != ref32).sum().item()} of "
                              f"{ref.numel()}")
                    t, _ = time_graph([lambda w=w, bn=bn, ns=ns, sm=sm, ks=ks: wx.wg_gemv(
                        x, *w, xs=xs, tile_rows=bn, stages=ns, xs_smem=sm, ksplit=ks) for w in stacks], dev,
                        args.replays)
                    rows.append(("wg_gemv" + (" xs smem" if sm else "") + (f" ks {ks}" if ks > 1 else ""), bn, ns,
                                 t, same))
            for kind, bn, ns, t, same in rows:
                emit({"probe": "wg_gemv", "shape": f"{n}x{k}", "name": name, "m": m, "kernel": kind, "bn": bn,
                      "ns": ns, "us": round(t, 2), "same_bits": same, "gpu": torch.cuda.get_device_name(dev),
                      "timing": how, "gbps": round(nbytes / t / 1e3, 1)})
        del stacks, words, sb
        torch.cuda.empty_cache()
    # the K = 4096 out projection at 64 rows: mma_gemv's rows split over programs (DELTASERVE_MMA_GEMV_SPLIT_ROWS,
    # with and without a register cap), each checked bit for bit against the unsplit launch
    if args.split:
        n, k = 2048, 4096
        p, s, b, _ = affine_weight((n, k), 4, 64, dev)
        words, sb = mg.repack_q4(p, s, b)
        nbytes = words.numel() * 4 + sb.numel() * 2
        stacks = [(words, sb)] + [(words.clone(), sb.clone()) for _ in range(15)]
        x = (torch.randn(64, k, device=dev) * 0.5).bfloat16()
        xs = x.float().view(64, k // 64, 64).sum(-1)
        ref = mg.mma_gemv(x, words, sb, xs=xs)
        for split, cap in (("0", "0"), ("32", "0"), ("32", "128"), ("16", "0")):
            os.environ["DELTASERVE_MMA_GEMV_SPLIT_ROWS"], os.environ["DELTASERVE_MMA_GEMV_SPLIT_MAXNREG"] = split, cap
            same = torch.equal(mg.mma_gemv(x, words, sb, xs=xs, out=torch.full_like(ref, float("nan"))), ref)
            bad += not same
            t, how = time_graph([lambda w=w: mg.mma_gemv(x, *w, xs=xs) for w in stacks], dev, args.replays)
            emit({"probe": "mma_gemv_split", "shape": f"{n}x{k}", "m": 64, "kernel": "mma_gemv", "bn": split,
                  "ns": cap, "us": round(t, 2), "same_bits": same, "gpu": torch.cuda.get_device_name(dev),
                  "timing": how, "gbps": round(nbytes / t / 1e3, 1)})
        os.environ["DELTASERVE_MMA_GEMV_SPLIT_ROWS"] = os.environ["DELTASERVE_MMA_GEMV_SPLIT_MAXNREG"] = "0"
    print("\n| shape | m | kernel | BN (split rows) | NS (maxnreg) | us | GB/s | same bits |\n|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['shape']} | {r['m']} | {r['kernel']} | {r['bn']} | {r['ns']} | {r['us']} | {r['gbps']} | "
              f"{r['same_bits']} |")
    print(f"{bad} forms differ")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

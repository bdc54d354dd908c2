"""(No longer runs on main: kernels/quant/dense_decode.py was removed after its measurement; check out 28cac9e to
run it. lab/NOTES.md, "The mixers' projections from bf16 copies".)

The dense decode projections from bf16 copies (dense_decode.dense_decode_mm on the dequantised weight) against the
q4 tensor-core GEMV (mma_gemv: wg_gemv from 17 rows) at the 35B-A3B's decode linears, for 8 / 16 / 32 / 64 rows.

Question (lab/NOTES.md, wave 43's Next 2): at 64 streams the q4 GEMVs run far from their bytes (the in_proj
30.1 us for 14.2 MB on the H200); a bf16 copy is 3.6x the bytes but a plain matmul. Does dense_mm at decode tiles
beat the q4 GEMV per launch, at which row counts, and with which tile?

Checks first, every config: the rows at m rows == the same rows of a 512-row dense_mm at its prefill config, bit
for bit (a row's bits never depend on M or on the tile), into NaN-poisoned outputs; the 64-row result against the
fp64 reference (max error / max |ref|). --tma 1: dense_decode_mm (TMA tiles, PDL), 0: dense_mm's pointer-load
kernel at the same tile. The DeltaNet in_proj also with its decode conv (--conv): mma_gemv(conv=) and
dense_decode_mm(conv=) (checked against the plain matmul then causal_conv, pool included). Then timings: a CUDA
graph of calls cycling weight copies past the L2 (sweep_common.time_graph), one JSON line each, a table last.

  python lab/probe_bf16_decode.py [--ms 8,16,32,64] [--bn 16,32,64,128] [--bk 64,128] [--ns 3,4,6]
                                      [--tma 1,0] [--shapes 0,1,2] [--conv "BN,BK,NS;..."]
                                      [--wgdense "BT,NS,RS;..."] [--out FILE]

--wgdense also times wgmma_dense.wg_dense_mm (the prefill's dequantising matmul) on the q4 natural repack at the
decode row counts: the same bits as dense_mm from 4-bit codes (checked like the others).
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

SHAPES = ((12352, 2048, "DeltaNet in_proj"), (9216, 2048, "attention qkv"), (2048, 4096, "out projection"))
L2_BYTES = 256 << 20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ms", default="8,16,32,64")
    ap.add_argument("--bn", default="16,32,64,128")
    ap.add_argument("--bk", default="64,128")
    ap.add_argument("--ns", default="3,4,6")
    ap.add_argument("--tma", default="1,0")
    ap.add_argument("--shapes", default="0,1,2")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--conv", default="", help="BN,BK,NS tiles (;-separated) of the conv form, in_proj only")
    ap.add_argument("--wgdense", default="", help="BT,NS,RS forms (;-separated) of wgmma_dense.wg_dense_mm on the "
                    "q4 natural repack: the same bits as dense_mm, from 4-bit codes")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    from kernel_cases import affine_weight
    from sweep_common import time_graph

    from deltaserve.kernels.gated_delta.triton_decode import causal_conv
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant.dense_decode import dense_decode_mm
    from deltaserve.kernels.quant.triton_affine import dense_mm, dequantize
    from deltaserve.kernels.triton_common import WeightSpec

    dev = torch.device("cuda")
    gpu = torch.cuda.get_device_name(dev)
    torch.manual_seed(0)
    bad, table = 0, []

    def emit(rec: dict) -> None:
        rec["gpu"] = gpu
        print(json.dumps(rec), flush=True)
        table.append(rec)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")

    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
    copies = lambda nbytes: max(1, min(16, -(-2 * L2_BYTES // nbytes)))  # noqa: E731  (a weight's copies past the L2)
    for n, k, name in [SHAPES[i] for i in ints(args.shapes)]:
        p, s, b, w64 = affine_weight((n, k), 4, 64, dev, bounded=True)  # as a quantiser's scales are
        words, sb = mg.repack_q4(p, s, b)
        nat = mg.repack_q4(p, s, b, order="natural")
        w16 = dequantize(WeightSpec(p, s, b, 4, 64))
        del p, s, b
        q4_bytes, bf_bytes = words.numel() * 4 + sb.numel() * 2, w16.numel() * 2
        q4_stacks = [(words, sb)] + [(words.clone(), sb.clone()) for _ in range(copies(q4_bytes) - 1)]
        bf_stacks = [w16] + [w16.clone() for _ in range(copies(bf_bytes) - 1)]
        x_all = (torch.randn(512, k, device=dev) * 0.5).bfloat16()
        ref512 = dense_mm(x_all, w16, torch.empty(512, n, dtype=torch.bfloat16, device=dev))  # prefill's config
        exact = x_all[:64].double() @ w64.t()
        del w64
        for m in ints(args.ms):
            x = x_all[:m]
            xs = x.float().view(m, k // 64, 64).sum(-1)
            t, how = time_graph([lambda w=w: mg.mma_gemv(x, *w, xs=xs) for w in q4_stacks], dev, args.replays)
            emit({"probe": "bf16_decode", "shape": f"{n}x{k}", "name": name, "m": m, "kernel": "mma_gemv q4",
                  "config": "-", "us": round(t, 2), "same_bits": "-", "gbps": round(q4_bytes / t / 1e3, 1),
                  "timing": how})
            for bn in ints(args.bn):
                for bk in ints(args.bk):
                    for ns in ints(args.ns):
                        for tma in ints(args.tma):
                            cfg = (64, bn, bk, 4, ns, bool(tma))
                            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
                            run = ((lambda w, o, c=cfg: dense_decode_mm(x, w, o, tile=c[:5])) if tma else
                                   (lambda w, o, c=cfg: dense_mm(x, w, o, config=c)))
                            try:
                                run(w16, out)
                                torch.cuda.synchronize()
                            except Exception as e:  # noqa: BLE001  a config past shared memory: skipped, named
                                print(f"  skip {name} m={m} {cfg}: {type(e).__name__} {str(e)[:80]}")
                                continue
                            same = torch.equal(out, ref512[:m])
                            err = ""
                            if m == 64:
                                err = round(((out.double() - exact).abs().max() / exact.abs().max()).item(), 5)
                            if not same:
                                bad += 1
                                print(f"  DIFFER {name} m={m} {cfg}: {(out != ref512[:m]).sum().item()} of "
                                      f"{out.numel()}")
                            t, how = time_graph([lambda w=w, o=out: run(w, o) for w in bf_stacks], dev,
                                                args.replays)
                            emit({"probe": "bf16_decode", "shape": f"{n}x{k}", "name": name, "m": m,
                                  "kernel": "dense_decode bf16" if tma else "dense_mm bf16",
                                  "config": f"BN{bn} BK{bk} NS{ns} {'tma' if tma else 'cp'}",
                                  "us": round(t, 2), "same_bits": same, "err": err,
                                  "gbps": round(bf_bytes / t / 1e3, 1), "timing": how})
            if args.wgdense:
                from deltaserve.kernels.quant.wgmma_dense import bf16_fma_exact, wg_dense_mm

                fma = bf16_fma_exact(nat[1])
                nat_stacks = [nat] + [(nat[0].clone(), nat[1].clone()) for _ in range(len(q4_stacks) - 1)]
                for spec in args.wgdense.split(";"):
                    bt, ns, rs = (int(v) for v in spec.split(","))
                    got = wg_dense_mm(x, *nat, out=torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev),
                                      bf16_fma=fma, tile_rows=bt, stages=ns, row_sets=rs)
                    same = torch.equal(got, ref512[:m])
                    if not same:
                        bad += 1
                        print(f"  DIFFER {name} m={m} wg_dense_mm {spec}: {(got != ref512[:m]).sum().item()} of "
                              f"{got.numel()}")
                    t, how = time_graph([lambda w=w, bt=bt, ns=ns, rs=rs: wg_dense_mm(
                        x, *w, bf16_fma=fma, tile_rows=bt, stages=ns, row_sets=rs) for w in nat_stacks], dev,
                        args.replays)
                    emit({"probe": "bf16_decode", "shape": f"{n}x{k}", "name": name, "m": m,
                          "kernel": "wg_dense_mm q4", "config": f"BT{bt} NS{ns} RS{rs} fma {int(fma)}",
                          "us": round(t, 2), "same_bits": same, "gbps": round(q4_bytes / t / 1e3, 1), "timing": how})
            if args.conv and n == SHAPES[0][0]:  # the in_proj's decode conv: 8192 channels of width 4
                chans, slots_n = 8192, 256
                cw = (torch.randn(chans, 4, device=dev) * 0.3).bfloat16()
                pool0 = torch.randn(slots_n, chans, 3, device=dev).bfloat16()
                slots = torch.randperm(slots_n, device=dev)[:m].int()
                ctx = torch.randint(0, 3, (m,), device=dev).int()  # some fresh sequences
                plain = dense_mm(x, w16, torch.empty(m, n, dtype=torch.bfloat16, device=dev), config=(64, 64, 64, 4, 3))
                want, want_pool = plain.clone(), pool0.clone()
                cu = torch.arange(m + 1, dtype=torch.int32, device=dev)
                causal_conv(want[:, :chans], cw, want_pool, cu, slots, ctx, 1, out=want[:, :chans])
                pool = pool0.clone()
                t, how = time_graph([lambda w=w: mg.mma_gemv(x, *w, xs=xs, conv=(cw, pool, slots, ctx, chans))
                                     for w in q4_stacks], dev, args.replays)
                emit({"probe": "bf16_decode", "shape": f"{n}x{k}", "name": name + " +conv", "m": m,
                      "kernel": "mma_gemv q4 +conv", "config": "-", "us": round(t, 2), "same_bits": "-",
                      "gbps": round(q4_bytes / t / 1e3, 1), "timing": how})
                for spec, early in [(sp, e) for sp in args.conv.split(";") for e in ("1", "0")]:
                    os.environ["DELTASERVE_DENSE_DECODE_CONV_EARLY"] = early
                    bn, bk, ns = (int(v) for v in spec.split(","))
                    tile = (64, bn, bk, 4, ns)
                    pool = pool0.clone()
                    got = dense_decode_mm(x, w16, torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev),
                                          conv=(cw, pool, slots, ctx, chans), tile=tile)
                    same = torch.equal(got, want) and torch.equal(pool, want_pool)
                    if not same:
                        bad += 1
                        print(f"  DIFFER conv m={m} {tile}: out {(got != want).sum().item()}, pool "
                              f"{(pool != want_pool).sum().item()}")
                    t, how = time_graph([lambda w=w, c=tile: dense_decode_mm(x, w, conv=(cw, pool, slots, ctx, chans),
                                                                             tile=c) for w in bf_stacks],
                                        dev, args.replays)
                    emit({"probe": "bf16_decode", "shape": f"{n}x{k}", "name": name + " +conv", "m": m,
                          "kernel": "dense_decode bf16 +conv" + (" early" if early == "1" else " late"),
                          "config": f"BN{bn} BK{bk} NS{ns} tma", "us": round(t, 2),
                          "same_bits": same, "gbps": round(bf_bytes / t / 1e3, 1), "timing": how})
        del q4_stacks, bf_stacks, words, sb, w16
        torch.cuda.empty_cache()
    # the table: per weight and m, the q4 GEMV and the two fastest configs of every other kernel
    print("\n| weight | m | kernel | config | us | GB/s | same bits |\n|---|---|---|---|---|---|---|")
    keys = sorted({(r["name"], r["m"]) for r in table}, key=lambda t: (t[0], t[1]))
    for name, m in keys:
        rows = [r for r in table if r["name"] == name and r["m"] == m]
        q4 = [r for r in rows if r["kernel"].startswith("mma")]
        best = []
        for kind in sorted({r["kernel"] for r in rows} - {r["kernel"] for r in q4}):
            best += sorted((r for r in rows if r["kernel"] == kind), key=lambda r: r["us"])[:2]
        for r in q4 + best:
            print(f"| {r['name']} | {m} | {r['kernel']} | {r['config']} | {r['us']} | {r['gbps']} | {r['same_bits']} |")
    print(f"{bad} configs differ from the 512-row prefill rows")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

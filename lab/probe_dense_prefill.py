"""The dense prefill projections two ways at the 35B-A3B's shapes (q4 g64): the wide kernel (the dequantised tile
staged in shared memory per K step, kernels/quant/triton_affine._affine_mm_wide_kernel) against dequantising the
whole weight to bf16 once (`dequantize`) and a plain bf16 tensor-core matmul over it (`dense_mm`), per tile
configuration, with cuBLAS on the same bf16 weight as the reference speed. Each output is checked against fp64 and
against the wide kernel's bits (the same products chained in the same K order should give them). Also the
dequantising warpgroup-MMA matmul (kernels/quant/wgmma_dense.py) per launch shape (--fused). Timing: a CUDA graph
over weight copies past the L2 (sweep_common.time_graph).

  python lab/probe_dense_prefill.py [--ms 512,4096] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1]),
                str(Path(__file__).resolve().parents[1] / "tests" / "gpu")]
from sweep_common import RecordSink, rel_err, time_graph  # noqa: E402

SHAPES = ((12352, 2048), (9216, 2048), (2048, 4096))
FUSED = "128,3,1,1;128,3,1,1,128;128,4,1,1;128,3,1,0;64,4,2,1;128,4,2,1;256,3,1,1"
CONFIGS = ((128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4),
           (128, 64, 64, 4, 4), (128, 128, 128, 8, 3), (256, 128, 64, 8, 3), (64, 256, 64, 8, 4))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ms", default="512,4096")
    ap.add_argument("--out")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--configs", help="dense_mm tiles 'BM,BN,BK,W,S[,TMA];...' instead of CONFIGS")
    ap.add_argument("--dequant-tiles", default="", help="dequantize tiles 'BN,BK,W;...' to time beside the default")
    ap.add_argument("--shapes", help="N:K,N:K instead of SHAPES")
    ap.add_argument("--fused", default=FUSED, help="wg_dense_mm launches 'BT,NS,RS,BF16_FMA[,MAXNREG];...' ('' none)")
    ap.add_argument("--skip-tiles", action="store_true", help="no dense_mm tile sweep (the default tile only)")
    args = ap.parse_args(argv)
    import torch.nn.functional as F
    from kernel_cases import affine_weight

    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import triton_affine as ta
    from deltaserve.kernels.quant import wgmma_dense as wdm
    from deltaserve.kernels.triton_common import WeightSpec

    dev = torch.device("cuda")
    sink = RecordSink(args.out, lambda r: f"{r['shape']:22} {r['label']:34} "
                      + (f"{r['us']:8.2f} us {r.get('tflops', 0):6.0f} TF/s" if r.get("us") else "")
                      + (f" err {r['err']:.2e} bits {'=' if r['same'] else '~'}" if "err" in r else "")
                      + (f" ERROR {r['error']}" if "error" in r else ""))
    torch.manual_seed(0)
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs.split(";")] if args.configs else CONFIGS
    dq_tiles = [tuple(int(v) for v in c.split(",")) for c in args.dequant_tiles.split(";") if c]
    shapes = [tuple(int(v) for v in sh.split(":")) for sh in args.shapes.split(",")] if args.shapes else SHAPES
    for n, k in shapes:
        copies = max(1, min(8, (256 << 20) // (n * k // 2)))
        weights = []
        for _ in range(copies):
            p, s, b, wd = affine_weight((n, k), 4, 64, dev, bounded=True)  # a quantiser's (s, b): bf16 fma exact
            weights.append((WeightSpec(p, s, b, 4, 64), wd))
        deq = [ta.dequantize(spec) for spec, _ in weights]
        natural = [mg.repack_q4(spec.w, spec.scales, spec.biases, order="natural") for spec, _ in weights]
        for m in (int(v) for v in args.ms.split(",")):
            x = torch.randn(m, k, device=dev).bfloat16()
            ref = x.double() @ weights[0][1].double().T
            outs = [torch.empty(m, n, dtype=torch.bfloat16, device=dev) for _ in weights]
            flops = 2.0 * m * n * k
            shape = f"M{m} N{n} K{k}"
            base = ta.affine_matmul(x, weights[0][0].w, weights[0][0].scales, weights[0][0].biases, 4, 64,
                                    config=ta.wide_config(weights[0][0]))  # the wide kernel whatever M

            def emit(label, fns, got=None):
                rec = dict(shape=shape, label=label)
                try:
                    if got is not None:
                        rec.update(err=rel_err(got(), ref), same=bool(torch.equal(got(), base)))
                    us, how = time_graph(fns, dev, args.replays)
                    rec.update(us=us, timing=how, tflops=flops / us / 1e6)
                except Exception as exc:  # noqa: BLE001  a configuration that fails is reported, not fatal
                    rec.update(error=repr(exc)[:300])
                sink.emit(rec)

            wcfg = ta.wide_config(weights[0][0])
            emit("wide kernel", [lambda j=j: ta.affine_matmul(x, weights[j][0].w, weights[j][0].scales,
                                                              weights[j][0].biases, 4, 64, out=outs[j], config=wcfg)
                                 for j in range(copies)], lambda: base)
            emit("dequantize alone", [lambda j=j: ta.dequantize(weights[j][0], out=deq[j]) for j in range(copies)])
            for tile in dq_tiles:
                emit("dequantize bn{} bk{} w{}".format(*tile),
                     [lambda j=j, tile=tile: ta.dequantize(weights[j][0], out=deq[j], tile=tile)
                      for j in range(copies)],
                     None)
                if not torch.equal(ta.dequantize(weights[0][0], tile=tile), ta.dequantize(weights[0][0])):
                    sink.emit(dict(shape=shape, label="dequantize bn{} bk{} w{}".format(*tile),
                                   error="values differ from the default tile's"))
            for launch in [tuple(int(v) for v in c.split(",")) for c in args.fused.split(";") if c]:
                bt, ns, rs, fma, *cap = launch
                os.environ["DELTASERVE_WG_DENSE_MAXNREG"] = str(cap[0] if cap else 0)  # (a launch option)
                if fma and not wdm.bf16_fma_exact(natural[0][1]):
                    sink.emit(dict(shape=shape, label=f"wg_dense_mm {launch}", error="bf16 fma not exact here"))
                    continue

                def got_f(launch=launch):
                    outs[0].fill_(float("nan"))
                    return wdm.wg_dense_mm(x, *natural[0], out=outs[0], bf16_fma=bool(launch[3]),
                                           tile_rows=launch[0], stages=launch[1], row_sets=launch[2])
                emit(f"wg_dense_mm bt{bt} ns{ns} rs{rs} fma{fma}" + (f" cap{cap[0]}" if cap else ""),
                     [lambda j=j, launch=launch: wdm.wg_dense_mm(x, *natural[j], out=outs[j], bf16_fma=bool(launch[3]),
                                                                 tile_rows=launch[0], stages=launch[1],
                                                                 row_sets=launch[2]) for j in range(copies)], got_f)
            os.environ.pop("DELTASERVE_WG_DENSE_MAXNREG", None)
            for cfg in ([] if args.skip_tiles else configs):
                label = "dense_mm bm{} bn{} bk{} w{} s{}".format(*cfg) + (" tma" if cfg[5:] and cfg[5] else "")

                def got(cfg=cfg):
                    outs[0].fill_(float("nan"))
                    return ta.dense_mm(x, deq[0], outs[0], cfg)
                emit(label, [lambda j=j, cfg=cfg: ta.dense_mm(x, deq[j], outs[j], cfg) for j in range(copies)],
                     got)
            scratch = torch.empty(n, k, dtype=torch.bfloat16, device=dev)
            emit("dequantize + dense_mm (default: affine_matmul's route)",
                 [lambda j=j: ta.dense_mm(x, ta.dequantize(weights[j][0], out=scratch), outs[j])
                  for j in range(copies)])
            emit("cuBLAS bf16 (dequantised weight)", [lambda j=j: F.linear(x, deq[j]) for j in range(copies)])
        weights = deq = natural = None  # the copies freed before the next shape (the lambdas above are done with them)
    return sink.finish()


if __name__ == "__main__":
    raise SystemExit(main())

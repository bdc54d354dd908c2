"""The prefill attention kernel (kernels/attention/triton_paged.paged_prefill_attention) at the 35B-A3B's attention
shape (Hq 16, Hkv 2, D 256, the output gate on) for one prompt of T new tokens after a context of C cached ones, under
launch variants (num_warps, num_stages, two key blocks a loop step: triton_paged.prefill_launch). None of them may
change a bit: each variant is first checked against the default launch bit for bit into a NaN-poisoned output (and
the default against fp64 attention), then timed as a CUDA graph of 10 calls (one per attention layer of the model,
each on its own cache and queries).

  python lab/probe_prefill_attention.py [--tokens 512] [--contexts 0,512,4096] [--launches "8,0,0;8,0,1;..."]
                                            [--out FILE] [--replays 20]
Exit status 1 when a variant differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

LAYERS = 10
HQ, HKV, D, BS = 16, 2, 256, 64


def parse_launches(text: str) -> list[tuple]:
    out = []
    for item in filter(None, (t.strip() for t in text.split(";"))):
        w, st, pair = (int(v) for v in item.split(","))
        out.append((w, st or None, bool(pair)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--contexts", default="0,512,4096")
    ap.add_argument("--launches", default="8,0,0;8,0,1;8,2,0;8,2,1;8,1,0;8,3,1")
    ap.add_argument("--out", default=None)
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args(argv)

    import kernel_cases as kc
    from sweep_common import time_graph
    from deltaserve.kernels.attention import reference as attn_ref
    from deltaserve.kernels.attention import triton_paged as tp

    dev = torch.device("cuda")
    torch.manual_seed(0)
    scale = D**-0.5
    rows, bad = [], 0
    for ctx in (int(c) for c in args.contexts.split(",")):
        probs = []
        for _ in range(LAYERS):
            p = kc.paged_problem(dev, [ctx], [args.tokens], HQ, HKV, D, BS)
            tp.write_kv(p["kc"], p["vc"], p["slots"], p["k"], p["v"])
            p["ctx"] = torch.tensor([ctx], device=dev)
            p["gate"] = torch.randn(args.tokens, HQ, D, device=dev).bfloat16()
            probs.append(p)

        def call(p, launch, out=None):
            return tp.paged_prefill_attention(p["q"], p["kc"], p["vc"], p["tables"], p["cu"], p["ctx"], scale,
                                              args.tokens, out=out, gate=p["gate"], launch=launch)

        p0 = probs[0]
        base = call(p0, None, kc.poisoned(p0["q"].shape, torch.bfloat16, dev))
        ref = attn_ref.paged_attention(p0["q"].double(), p0["kc"].double(), p0["vc"].double(), p0["tables"], [ctx],
                                       [args.tokens], scale) * torch.sigmoid(p0["gate"].double())
        err = float((base.double() - ref).abs().max() / ref.abs().max())
        for launch in [None] + parse_launches(args.launches):
            got = call(p0, launch, kc.poisoned(p0["q"].shape, torch.bfloat16, dev))
            same = bool(torch.equal(got, base))
            bad += not same
            us, how = time_graph([lambda p=p, launch=launch: call(p, launch) for p in probs], dev, args.replays)
            name = "default" if launch is None else f"w{launch[0]} st{launch[1] or 'dflt'} pair{int(launch[2])}"
            rows.append(dict(probe="prefill_attention", tokens=args.tokens, ctx=ctx, launch=name, us=us, how=how,
                             same_bits=same, err_vs_fp64=err))
            print(json.dumps(rows[-1]), flush=True)
    print("| ctx | launch | us | same bits |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['ctx']} | {r['launch']} | {r['us']:.2f} | {r['same_bits']} |")
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"{bad} variants differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The DeltaNet prefill's conv at the 35B-A3B's shape (the fused in-projection's output [T, 12352] read as a column
view of its first 8192 channels, written as the q / k / v sections 2048 / 2048 / 4096, kernel width 4), one fresh
sequence of T tokens, timed in a CUDA graph of --reps launches (the model's prefill graphs run it so); and
gdn_prefill's initial-states gather both ways (DELTASERVE_GDN_INITIAL_STATES triton / torch, checked equal first).
At d66546d this probe also ran the conv at other (BT, BC) tiles, all slower than 16 x 64 (lab/NOTES.md), and that
switch was removed. The weight runs as [C, K] and as the model's taps-major view (a [K, C] copy), checked equal. One JSON line each, a table last.

  python lab/probe_prefill_conv.py --t 512,4096 [--out results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_router_rows import timed  # noqa: E402  (the probes' CUDA-graph timer)

C_TOTAL, KEY, VALUE, KW = 12352, 2048, 4096, 4


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--t", default="512,4096")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    from deltaserve.kernels.gated_delta import triton_decode as td

    dev = torch.device("cuda")
    gpu = torch.cuda.get_device_name(dev)
    c = 2 * KEY + VALUE
    rows = []
    for t in (int(v) for v in args.t.split(",")):
        proj = torch.randn(t, C_TOTAL, device=dev).bfloat16()
        x = proj[:, :c]
        w = (torch.randn(c, KW, device=dev) * 0.5).bfloat16()
        pool = torch.randn(4, c, KW - 1, device=dev).bfloat16()
        cu = torch.tensor([0, t], device=dev, dtype=torch.int32)
        slots = torch.tensor([2], device=dev, dtype=torch.int32)
        ctx = torch.tensor([0], device=dev)
        want = None
        for name, wv in (("w [C,K]", w), ("w taps-major", w.t().contiguous().t())):  # the model's prefill: the second
            got = torch.cat(td.causal_conv(x, wv, pool.clone(), cu, slots, ctx, t, sections=(KEY, KEY)), dim=1)
            want = got if want is None else want
            us, host = timed(lambda: td.causal_conv(x, wv, pool, cu, slots, ctx, t, sections=(KEY, KEY)), args.reps)
            rows.append(dict(probe="prefill_conv", t=t, variant=f"tile 16,64 {name}", us=round(us, 2),
                             host_us=round(host, 1), bit_equal=torch.equal(got, want), gpu=gpu))
    ssm = torch.randn(8, 32, 128, 128, device=dev)
    slots = torch.tensor([5], device=dev, dtype=torch.int32)
    for ctx_len in (0, 100):
        ctx = torch.tensor([ctx_len], device=dev)
        want = None
        for mode in ("torch", "triton"):
            os.environ["DELTASERVE_GDN_INITIAL_STATES"] = mode
            got = td.initial_states(ssm, slots, ctx)
            want = want if want is not None else got
            us, host = timed(lambda: td.initial_states(ssm, slots, ctx), args.reps)
            rows.append(dict(probe="initial_states", t=ctx_len, variant=mode, us=round(us, 2), host_us=round(host, 1),
                             bit_equal=torch.equal(got, want), gpu=gpu))
    os.environ.pop("DELTASERVE_GDN_INITIAL_STATES", None)
    for r in rows:
        print(json.dumps(r))
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"{'probe':<15} {'T/ctx':>6} {'variant':<16} {'GPU us':>8} {'host us':>8}  equal")
    for r in rows:
        print(f"{r['probe']:<15} {r['t']:>6} {r['variant']:<16} {r['us']:8.2f} {r['host_us']:8.1f}  {r.get('bit_equal', '-')}")
    return 0 if all(r.get("bit_equal", True) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The prefill MoE's two warpgroup-MMA launches (kernels/quant/wgmma_experts.wg_matmul_experts: gated gate/up, then
the scaled down) at prefill sizes of the 35B-A3B (256 routed experts + the shared one stacked last, top-8, H 2048,
I 512, q4 g64), over launch shapes that never change a bit: shared-memory slots (NS) of each launch, groups a
loop step (GS) and down's 64-row sets a program (row_sets). Each variant's output, into a NaN-poisoned buffer, is
compared bit for bit with the model's default launch first; then it is timed in a CUDA graph of --calls launches,
each on a routing and input of its own (the 403 MB of experts do not stay in the 50 MB L2, as in the model). GB/s
counts the weight bytes of the experts that the routing touches, once. One JSON line each, a table last.

  python lab/probe_prefill_experts.py --t 512,4096 --gated-ns 3,4,6 --down-ns 3,5,9 --gs 1,2 --sets 1,2 \
      [--env fold:DELTASERVE_WGMMA_FOLD=1 ...] [--out f.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_moe_t1: the same MoE inputs


@contextmanager
def env_set(name: str, value: str | None):
    """`name` set to value (None: unset) inside the block, restored after."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def env_variants(specs: list[str]) -> list[tuple[str, list[tuple[str, str]]]]:
    """--env's LABEL:NAME=V[,NAME=V] specs as (label, [(name, value)]); none given: the environment as it is."""
    out = []
    for spec in specs:
        label, colon, pairs = spec.partition(":")
        knobs = [tuple(p.split("=", 1)) for p in re.split(r",(?=DELTASERVE_)", pairs) if p]  # values may hold commas
        if not colon or not label or any(len(k) != 2 or not k[0].startswith("DELTASERVE_") for k in knobs):
            raise SystemExit(f"--env: LABEL:DELTASERVE_NAME=V[,DELTASERVE_NAME=V], found {spec!r}")
        out.append((label, knobs))
    return out or [("as set", [])]


def graph_us(calls) -> float:
    """Mean microseconds a launch of a CUDA graph holding the given launches in turn (graph_capture's: after
    eager and side-stream warm-ups and one replay), from one timed replay."""
    from graph_capture import capture_calls

    graph = capture_calls(calls)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / len(calls)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--t", default="512,4096", help="token counts")
    ap.add_argument("--gated-ns", default="3,4,6", help="the gated launch's slots ('': no gated launch)")
    ap.add_argument("--down-ns", default="3,5,9", help="the down launch's slots ('': no down launch)")
    ap.add_argument("--gs", default="1,2", help="groups a loop step of both launches, or 'default' (each its own)")
    ap.add_argument("--sets", default="1,2", help="down's 64-row sets a program (wg_matmul_experts row_sets)")
    ap.add_argument("--bn", default="", help="sorted rows of x a tile (default: the model's, wg_tile_rows)")
    ap.add_argument("--env", action="append", default=[],
                    help="LABEL:NAME=V[,NAME=V]: one more variant of launch knobs, e.g. fold:DELTASERVE_WGMMA_FOLD=1 "
                         "(repeatable; without any, the environment as it is)")
    ap.add_argument("--out", help="append one JSON line per timing here")
    args = ap.parse_args(argv)
    from probe_moe_t1 import I, NUM_E as num_e, SLOTS as slots, H, expert_stacks, probe_inputs

    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import wgmma_experts as wx

    dev = torch.device("cuda")
    torch.manual_seed(0)
    gate, up, down = expert_stacks(dev)
    table = []
    for t in (int(v) for v in args.t.split(",")):
        routes, xin, sums, hs, scale = probe_inputs(dev, t, args.calls)
        bn = wx.wg_tile_rows(t * slots)
        ref_tiles = [mg.mma_expert_tiles(r, num_e, bn) for r in routes]
        touched = sum(int(torch.unique(r).numel()) for r in routes) / len(routes)
        gated_bytes = touched * 2 * I * H * (0.5 + 4 / 64)  # words + (s, b) bf16 pairs a group of 64
        down_bytes = touched * H * I * (0.5 + 4 / 64)
        ref_g = wx.wg_matmul_experts(xin[0], *gate, routes[0], ref_tiles[0], slots, xs=sums[0], up=up,
                                     stages=wx.wg_moe_stages(bn))
        ref_d = wx.wg_matmul_experts(hs[0], *down, routes[0], ref_tiles[0], 1, scale=scale,
                                     stages=wx.wg_moe_down_stages(bn))
        print(f"T={t}: {bn}-row tiles, {touched:.0f} experts touched, defaults NS {wx.wg_moe_stages(bn)} / "
              f"{wx.wg_moe_down_stages(bn)}", flush=True)
        shapes = [(int(b), g, e) for b in (args.bn or str(bn)).split(",") for g in args.gs.split(",")
                  for e in env_variants(args.env)]
        for bn, gs, (label, knobs) in shapes:
            tiles = [mg.mma_expert_tiles(r, num_e, bn) for r in routes]
            pin = None if gs == "default" else f"{gs}@64"  # default: each launch's own (wg_step_groups)
            with ExitStack() as knob_env:
                for name, value in [("DELTASERVE_MOE_WGMMA_GROUPS", pin), ("DELTASERVE_MOE_WGMMA_DOWN_GROUPS", pin),
                                    *knobs]:
                    knob_env.enter_context(env_set(name, value))
                variants = [("gated", ns, 1, ref_g, gated_bytes) for ns in args.gated_ns.split(",") if ns]
                variants += [("down", ns, int(rs), ref_d, down_bytes) for rs in args.sets.split(",")
                             for ns in args.down_ns.split(",") if ns]
                for form, ns, rs, ref, nbytes in variants:
                    ns = int(ns)
                    if form == "gated":
                        def call(j, out=None, ns=ns):
                            return wx.wg_matmul_experts(xin[j], *gate, routes[j], tiles[j], slots, xs=sums[j],
                                                        up=up, stages=ns, out=out)
                    else:
                        def call(j, out=None, ns=ns, rs=rs):
                            return wx.wg_matmul_experts(hs[j], *down, routes[j], tiles[j], 1, scale=scale,
                                                        stages=ns, out=out, row_sets=rs)
                    try:
                        got = call(0, torch.full_like(ref, float("nan")))
                        bits = ref.view(torch.int16) if ref.dtype == torch.bfloat16 else ref.view(torch.int32)
                        gbits = got.view(bits.dtype)
                        diff = int((gbits != bits).sum()) + int(got.isnan().sum())
                        us = graph_us([lambda j=j: call(j) for j in range(args.calls)])
                        err = ""
                    except Exception as e:  # a shape the kernel refuses (e.g. shared memory): say so, go on
                        diff, us, err = -1, float("nan"), f"{type(e).__name__}: {str(e)[:120]}"
                    rec = {"probe": "prefill_experts", "t": t, "bn": bn, "form": form, "ns": ns, "gs": gs,
                           "sets": rs, "env": label, "us": round(us, 2),
                           "gbs": round(nbytes / us / 1e3, 1) if us == us else None, "differing": diff, "error": err}
                    print(json.dumps(rec), flush=True)
                    table.append(rec)
                    if args.out:
                        with open(args.out, "a") as f:
                            f.write(json.dumps(rec) + "\n")
    print("\n| T | form | knobs | NS | GS | sets | us | GB/s | elements differing from the default |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['t']} | {r['form']} | {r['env']} | {r['ns']} | {r['gs']} | {r['sets']} | {r['us']} | {r['gbs']} | "
              f"{r['differing'] if not r['error'] else r['error']} |")
    return int(any(r["differing"] != 0 for r in table))


if __name__ == "__main__":
    raise SystemExit(main())

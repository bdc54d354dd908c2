"""The decode MoE's expert kernels at one token, the 35B-A3B's shapes (256 routed experts + the shared one stacked
last, top-8 of 512 wide, H 2048, q4 g64): the program to run under Nsight Compute, e.g.

  ncu --clock-control none -k regex:"_mma_experts|_gate_up|_down" --launch-skip 3 --launch-count 6 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats python lab/probe_moe_t1.py

Each form is launched --calls times on its own routing and input (the first compiles), so the experts read come
from DRAM as in the model, not from the L2: the tensor-core gated gate/up and the scaled down (kernels/moe/
mma_experts.mma_matmul_experts, default configuration), then the CUDA-core block (kernels/moe/triton_moe_gemv.
moe_decode_v2: router, top-k, gate/up, down, combine). Prints each form's mean us over CUDA events as a sanity
line (eager, no PDL overlap)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))


NUM_E, H, I, SLOTS = 257, 2048, 512, 9  # the 35B-A3B's MoE: 256 routed experts + the shared one stacked last


def expert_stacks(dev):
    """The MoE block's random repacked q4 g64 stacks: gate, up [E, I, H] and down [E, H, I]."""
    from kernel_cases import affine_weight

    from deltaserve.kernels.moe import mma_experts as mx

    def stack(n, k):
        p, s, b, _ = affine_weight((NUM_E, n, k), 4, 64, dev)
        return mx.repack_q4_experts(p, s, b)

    return stack(I, H), stack(I, H), stack(H, I)


def probe_inputs(dev, t: int, calls: int):
    """For t tokens, `calls` of each: routings (top-8 of the 256 routed experts, sorted, then the shared expert),
    the gate/up inputs x and their group sums, down's inputs; and one fp32 scale per (token, slot) row."""
    from deltaserve.kernels.quant.triton_gemv import prep_x

    routes = [torch.cat([torch.rand(t, 256, device=dev).topk(8, dim=1).indices.sort(dim=1).values,
                         torch.full((t, 1), 256, device=dev)], 1).int() for _ in range(calls)]
    xs_in = [torch.randn(t, H, device=dev).bfloat16() for _ in range(calls)]
    sums = [prep_x(v, 4, 64)[1] for v in xs_in]
    hs = [torch.randn(t * SLOTS, I, device=dev).bfloat16() for _ in range(calls)]
    return routes, xs_in, sums, hs, torch.rand(t * SLOTS, device=dev)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--t", type=int, default=1, help="tokens")
    ap.add_argument("--gated-config", help="W,RB,AHEAD,LOOP of the tensor-core gate/up (default: the library's)")
    ap.add_argument("--only", choices=("gated", "scaled", "cuda"), help="one form alone")
    args = ap.parse_args(argv)
    from kernel_cases import moe_problem

    from deltaserve.kernels.moe.triton_moe_gemv import moe_decode_v2
    from deltaserve.kernels.moe import mma_experts as mx

    dev = torch.device("cuda")
    h, i, slots, t = H, I, SLOTS, args.t
    torch.manual_seed(0)
    gate, up, down = expert_stacks(dev)
    routes, xs_in, sums, hs, scale = probe_inputs(dev, t, args.calls)
    tiles = [mx.mma_expert_tiles(r, NUM_E) for r in routes]

    def timed(name, fn):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn(0)  # compiles
        torch.cuda.synchronize()
        start.record()
        for j in range(1, args.calls):
            fn(j)
        end.record()
        torch.cuda.synchronize()
        print(f"{name:28s} T={t}: {start.elapsed_time(end) * 1e3 / (args.calls - 1):8.2f} us per call (eager)")

    cfg = tuple(int(v) for v in args.gated_config.split(",")) if args.gated_config else None
    if args.only in (None, "gated"):
        timed(f"mma experts gated {cfg or ''}", lambda j: mx.mma_matmul_experts(
            xs_in[j], *gate, routes[j], slots, xs=sums[j], tiles=tiles[j], up=up, config=cfg))
    if args.only in (None, "scaled"):
        timed("mma experts scaled", lambda j: mx.mma_matmul_experts(hs[j], *down, routes[j], 1, tiles=tiles[j],
                                                                     scale=scale))
    if args.only not in (None, "cuda"):
        return 0
    x0, kw, _ = moe_problem(dev, t, h, 256, i, i, 4, 64)
    res = kw.pop("residual")
    inputs = [torch.randn_like(x0) for _ in range(args.calls)]
    timed("cuda-core moe_decode_v2", lambda j: moe_decode_v2(inputs[j], top_k=8, residual=res, **kw))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a dependent kernel boundary costs at batch 1, and what a grid barrier inside one persistent kernel costs
instead: the floor under a decode step of ~345 dependent kernels (lab/NOTES.md wave 43: the step is bound by its
boundaries, and moving bytes earlier did not shorten the chain).

Each link: every one of P programs reads the value another program stored in the link before (a cross-SM
dependency, as every decode kernel has) and stores it + 1. Forms, N links in a CUDA graph:
  launch    N kernels, no PDL (each starts after the one before completed)
  pdl       N kernels launched with PDL (open first, wait, then the load and store: the decode kernels' protocol)
  barrier   one kernel of P resident programs doing N links, a grid barrier between them (a release atomic on one
            counter, then spinning on acquire loads until all P arrived)
Every form is checked (each value == N at the end). Median us a link over the replays.

  python lab/probe_chain.py [--links 345] [--programs 1,132,264]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from deltaserve.kernels.triton_pdl import pdl_open, pdl_wait  # noqa: E402


@triton.jit
def _link(src, dst, PDL: tl.constexpr = False):
    pdl_open(PDL)
    pdl_wait(PDL)
    pid = tl.program_id(0)
    p = tl.num_programs(0)
    v = tl.load(src + (pid + 1) % p, cache_modifier=".cg")
    tl.store(dst + pid, v + 1)


@triton.jit
def _persistent(buf, counter, LINKS: tl.constexpr):
    # buf [2, P]: link i reads row i % 2 (another program's value) and writes row (i + 1) % 2
    pid = tl.program_id(0)
    p = tl.num_programs(0)
    for i in range(LINKS):
        v = tl.load(buf + (i % 2) * p + (pid + 1) % p, cache_modifier=".cg")
        tl.store(buf + ((i + 1) % 2) * p + pid, v + 1)
        tl.debug_barrier()  # the program's store ordered before its arrival, whichever thread made either
        tl.atomic_add(counter, 1, sem="release", scope="gpu")
        target = (i + 1) * p
        seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
        while seen < target:
            seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()


def time_graph(fn, replays: int) -> float:
    """Median ms of a replay of `fn` captured in a CUDA graph (graph_capture.capture_calls: warmed up eagerly
    and on a side stream, replayed once) over `replays` timed replays."""
    from graph_capture import capture_calls

    graph = capture_calls([fn])
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--links", type=int, default=345)
    ap.add_argument("--programs", default="1,132,264")
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args()
    n = args.links
    print(f"# {torch.cuda.get_device_name()}, {n} links, us a link (median of {args.replays} graph replays)")
    print("| programs | launch | pdl | barrier |\n|---|---|---|---|")
    for p in (int(v) for v in args.programs.split(",")):
        row = []
        for form in ("launch", "pdl", "barrier"):
            bufs = [torch.zeros(p, dtype=torch.int32, device="cuda") for _ in range(2)]
            counter = torch.zeros(1, dtype=torch.int32, device="cuda")
            pair = torch.zeros(2, p, dtype=torch.int32, device="cuda")

            def run():
                if form == "barrier":
                    pair.zero_()
                    counter.zero_()
                    _persistent[(p,)](pair, counter, LINKS=n)
                else:
                    bufs[0].zero_()
                    kw = {"PDL": True, "launch_pdl": True} if form == "pdl" else {}
                    for i in range(n):
                        _link[(p,)](bufs[i % 2], bufs[(i + 1) % 2], **kw)

            ms = time_graph(run, args.replays)
            got = pair[n % 2] if form == "barrier" else bufs[n % 2]
            if not torch.equal(got, torch.full_like(got, n)):
                raise SystemExit(f"{form} at {p} programs: values {got[:4].tolist()}..., expected {n}")
            row.append(f"{ms * 1e3 / n:.3f}")
        print(f"| {p} | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

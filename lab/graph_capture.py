"""One CUDA graph of a list of zero-argument calls, for timing kernels without launch gaps (lab/kernels_timing.py,
lab/sweep_decode_kernels.py)."""

from __future__ import annotations

import torch


def capture_calls(sequence, warmup=None) -> torch.cuda.CUDAGraph:
    """A CUDA graph of the calls in `sequence`, in order. First `warmup` (default: `sequence`) runs eagerly
    (compiles, allocates) and once more on a side stream, as capture requires; the graph is replayed once and
    synchronised before it is returned, so a timing loop measures steady-state replays only."""
    warmup = sequence if warmup is None else warmup
    for f in warmup:
        f()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in warmup:
            f()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in sequence:
            f()
    graph.replay()
    torch.cuda.synchronize()
    return graph

"""Helpers for tensor-parallel tests: N ranks of a model in one process (threads + a barrier communicator), for
checks of the sharding math that need no process group; the gloo tests start real processes."""

from __future__ import annotations

import threading
from typing import Callable

import torch

from deltaserve.model.parallel import Parallel
from deltaserve.weights.loader import load_checkpoint


class ThreadCommunicator:
    """all_gather among `size` threads of one process: each writes its tensor, all meet, each copies all."""

    def __init__(self, shared: "ThreadGroup", rank: int):
        self.shared, self.rank, self.size = shared, rank, shared.size

    def all_gather(self, x: torch.Tensor, what: str) -> torch.Tensor:
        g = self.shared
        g.slots[self.rank] = x.contiguous()
        g.barrier.wait()
        out = torch.stack(g.slots)  # every thread reads all slots before any writes its next one
        g.barrier.wait()
        return out


class ThreadGroup:
    def __init__(self, size: int, timeout_s: float = 120):
        self.size = size
        self.slots: list[torch.Tensor | None] = [None] * size
        self.barrier = threading.Barrier(size, timeout=timeout_s)

    def parallel(self, rank: int, expert_parallel: bool = False) -> Parallel:
        return Parallel(rank, self.size, ThreadCommunicator(self, rank), expert_parallel)


def run_ranks(size: int, fn: Callable[[int], object]) -> list:
    """fn(rank) on `size` threads at once; their results in rank order (the first exception is raised)."""
    results: list = [None] * size
    errors: list = []

    def body(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def load_ranks(path, size: int, dtype: torch.dtype | None = torch.float32, expert_parallel: bool = False):
    """The `size` rank models of a checkpoint, sharing one thread group (loaded one after the other)."""
    group = ThreadGroup(size)
    return [load_checkpoint(path, "cpu", dtype, progress=False, parallel=group.parallel(r, expert_parallel)).model
            for r in range(size)]

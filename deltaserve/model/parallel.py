"""The collectives a tensor-parallel model's forward makes, and where it sits among the ranks.

A model built for rank r of N (model/tp_layout.py) computes, in each layer, a PARTIAL sum: the mixer's output
projection and the feed-forward's down projection are row-parallel (each rank holds some input columns), and under
expert parallelism each rank adds only its experts' terms. The decoder layer sums the partials of all ranks with
`reduce` before adding the residual, once per mixer and once per feed-forward. The embedding and the output head are
vocabulary-parallel: `embed` looks up the rows this rank holds (zeros elsewhere) and sums over ranks (exactly one
rank contributes each row, so that sum is exact), `gather_vocab` concatenates the ranks' logits columns.

`reduce` is an all-gather of the N partials followed by a sum in rank order (fp32, rounded once to the activation
dtype), never the backend's all-reduce: NCCL's and gloo's reductions add in an order that depends on the algorithm
they pick for the message size (ring chunks, trees), so a token's bits would depend on how many others share the
step. Summing gathered partials in rank order is the same arithmetic for every row and on every rank (every rank
ends with identical hidden states, so routing and sampling agree), whatever the batch. For N = 2 the all-gather
moves the same bytes as a ring all-reduce; for larger N more (N-1 partials in, instead of 2(N-1)/N of one).

With size 1 (`SINGLE`, the default of every model) every method returns its input: the single-device path is
unchanged.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch


class ParallelError(RuntimeError):
    """A collective failed: a peer rank exited or did not answer in time. Every rank stops."""


class Communicator(Protocol):
    rank: int
    size: int

    def all_gather(self, x: torch.Tensor, what: str) -> torch.Tensor:
        """[size, *x.shape]: every rank's x, in rank order (identical on every rank)."""
        ...


class TorchCommunicator:
    """all_gather over a torch.distributed process group (NCCL between GPUs, gloo on CPU). Errors (a peer that
    exited: gloo reports it at once; one that hangs: the group's timeout) become a ParallelError that says so."""

    def __init__(self, group, rank: int, size: int, timeout_s: float):
        self.group, self.rank, self.size, self.timeout_s = group, rank, size, timeout_s

    def all_gather(self, x: torch.Tensor, what: str) -> torch.Tensor:
        import torch.distributed as dist

        x = x.contiguous()
        out = torch.empty((self.size * x.shape[0], *x.shape[1:]) if x.dim() else (self.size,), dtype=x.dtype,
                          device=x.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch >= 2.13 renamed it
        try:
            gather(out, x, group=self.group)
        except (RuntimeError, ValueError) as e:
            raise ParallelError(
                f"tensor-parallel rank {self.rank} of {self.size}: the all-gather of the {what} failed ({e}); a peer "
                f"rank exited or did not answer within {self.timeout_s:g} s, so every rank stops") from None
        return out.view(self.size, *x.shape)


class Parallel:
    """rank, size and the communicator of one model instance; expert_parallel: the MoE blocks hold experts
    [r E/N, (r+1) E/N) whole instead of a slice of every expert."""

    def __init__(self, rank: int = 0, size: int = 1, comm: Communicator | None = None, expert_parallel: bool = False):
        if size > 1 and comm is None:
            raise ValueError("a tensor-parallel model (size > 1) needs a communicator")
        self.rank, self.size, self.comm, self.expert_parallel = rank, size, comm, expert_parallel

    def reduce(self, x: torch.Tensor, what: str = "layer output") -> torch.Tensor:
        """The sum over ranks of each rank's partial x, added in rank order in fp32 and rounded once."""
        if self.size == 1:
            return x
        parts = self.comm.all_gather(x, what)  # [N, *x.shape]
        acc = parts[0].float()  # fp32 partials: acc aliases parts[0], which is ours
        for i in range(1, self.size):
            acc += parts[i]
        return acc.to(x.dtype)

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., V/N] logits of this rank's vocabulary rows -> [..., V] (rank r's columns at r V/N: no arithmetic)."""
        if self.size == 1:
            return logits
        parts = self.comm.all_gather(logits, "logits")  # [N, ..., V/N]
        return parts.movedim(0, -2).reshape(*logits.shape[:-1], self.size * logits.shape[-1])

    def embed(self, lookup: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor, vocab: int) -> torch.Tensor:
        """Vocabulary-parallel lookup: lookup(local ids) on the rows this rank holds, zeros for the other ids, summed
        over ranks (one nonzero term per row: exact)."""
        if self.size == 1:
            return lookup(ids)
        rows = vocab // self.size
        local = ids - self.rank * rows
        inside = (local >= 0) & (local < rows)
        x = lookup(local.clamp(0, rows - 1)).masked_fill(~inside[:, None], 0)
        return self.reduce(x, "embedding")

    def expert_fn(self, experts, num_experts: int) -> Callable[[torch.Tensor, int], torch.Tensor]:
        """forward_expert by GLOBAL expert id: under expert parallelism this rank's experts (bank index e - first)
        and zeros for the others (they add exactly nothing to the fp32 combine); else the bank's own."""
        if not self.expert_parallel or self.size == 1:
            return experts.forward_expert
        per = num_experts // self.size
        first = self.rank * per

        def forward_expert(x: torch.Tensor, e: int) -> torch.Tensor:
            if first <= e < first + per:
                return experts.forward_expert(x, e - first)
            return x.new_zeros(x.shape)

        return forward_expert

    def local_routes(self, ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert parallelism on the fast path: (ids into this rank's bank, [T, k] bool mask of the picks it holds).
        Picks of other ranks point at local expert 0 (fixed shapes, no host sync; the caller zeroes their terms)."""
        per = num_experts // self.size
        local = ids.long() - self.rank * per
        mine = (local >= 0) & (local < per)
        return torch.where(mine, local, 0).to(ids.dtype), mine


SINGLE = Parallel()

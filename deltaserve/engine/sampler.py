"""The engine's sampling stage: each step's rows sampled on the logits' device, with no host synchronisation.

Tokens are kernels/sampling.sample's pure function of (logits, seed, position), bit for bit; this module only
decides how to compute it cheaply:
  - the rows' parameters reach the device in one pinned, asynchronous copy, and which stages run (greedy only,
    top-k, top-p, min-p, penalties) is decided from the host parameters (`SamplingFlags`), never read back;
  - rows without top-k / top-p / min-p (greedy and plain temperature sampling: the defaults) take two Triton
    launches on the GPU (kernels/triton_sampling.sample_plain: the same bits as the torch sequence);
  - the penalties' token statistics live on the device per state slot (`PenaltyState`), set once when a request
    first samples and updated by each step's sampled ids, instead of being rebuilt from the token lists each step.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

import torch

from ..kernels import backend
from ..kernels.sampling import (SamplingFlags, SamplingTensors, apply_allowed_mask, apply_penalties, row_keys, sample,
                               seed_to_int64)
from ..structured.matcher import token_bitmask
from .request import Request
from .transfer import to_device


class PenaltyState:
    """Per-state-slot token statistics for the penalties, on the device: seen [S, V] bool (prompt and output
    tokens: repetition) and counts [S, V] fp32 (output tokens: presence, frequency). A slot's rows are set from
    its request's tokens the first time that request samples there, then each sampled id is added on the device."""

    def __init__(self, num_slots: int, vocab: int, device: torch.device):
        self.seen = torch.zeros(num_slots, vocab, dtype=torch.bool, device=device)
        self.counts = torch.zeros(num_slots, vocab, dtype=torch.float32, device=device)
        self.owner: list[Request | None] = [None] * num_slots
        self.device = device

    def rows(self, reqs: Sequence[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """(seen, counts) [B, V] of the requests' slots, each slot first set up for its request if it is new."""
        for r in reqs:
            if self.owner[r.state_slot] is not r:
                self._reset(r)
        slots = to_device([r.state_slot for r in reqs], torch.int64, self.device)
        return self.seen.index_select(0, slots), self.counts.index_select(0, slots)

    def _reset(self, r: Request) -> None:
        s = r.state_slot
        self.seen[s].zero_()
        self.counts[s].zero_()
        ids = to_device(r.prompt_token_ids + r.output_token_ids, torch.int64, self.device)
        self.seen[s].index_fill_(0, ids, True)
        if r.output_token_ids:
            out = to_device(r.output_token_ids, torch.int64, self.device)
            self.counts[s].index_put_((out,), torch.ones_like(out, dtype=torch.float32), accumulate=True)
        self.owner[s] = r

    def record(self, reqs: Sequence[Request], ids: torch.Tensor) -> None:
        """Add each request's sampled id (ids[b], device) to its slot's statistics."""
        slots = to_device([r.state_slot for r in reqs], torch.int64, self.device)
        self.seen.index_put_((slots, ids), torch.ones_like(ids, dtype=torch.bool))
        self.counts.index_put_((slots, ids), torch.ones_like(ids, dtype=torch.float32), accumulate=True)


def uses_penalties(r: Request) -> bool:
    p = r.params
    return p.repetition_penalty != 1.0 or bool(p.presence_penalty) or bool(p.frequency_penalty)


def plain_sampling(p) -> bool:
    """Greedy or plain temperature sampling: no top-k / top-p / min-p, no penalties, no logprobs asked (what a
    decode graph samples itself; the SamplingParams default)."""
    return (p.top_k <= 0 and p.top_p >= 1 and p.min_p <= 0 and p.repetition_penalty == 1.0
            and not p.presence_penalty and not p.frequency_penalty and p.logprobs is None)


class Sampler:
    """Samples a step's rows: `sample(logits [R, V] fp32, requests, positions)` -> ids [R] int64 on the device."""

    def __init__(self, vocab_size: int, num_slots: int, device: torch.device):
        self.vocab_size, self.num_slots, self.device = vocab_size, num_slots, device
        self.penalties: PenaltyState | None = None  # made when the first request with a penalty samples
        # request_id -> its sampled rows' log-probabilities (device tensors), oldest first: SamplingParams.logprobs
        self.logprobs: dict[str, deque] = {}

    def tensors(self, reqs: Sequence[Request], positions: Sequence[int]) -> tuple[SamplingTensors, SamplingFlags]:
        """The rows' parameters on the device (two asynchronous copies) and their stages as host facts."""
        ps = [r.params for r in reqs]
        f32 = to_device([[p.temperature for p in ps], [p.top_p for p in ps], [p.min_p for p in ps],
                         [p.repetition_penalty for p in ps], [p.presence_penalty for p in ps],
                         [p.frequency_penalty for p in ps]], torch.float32, self.device)
        i64 = to_device([[p.top_k for p in ps], [seed_to_int64(r.seed) for r in reqs], list(positions)],
                        torch.int64, self.device)
        t = SamplingTensors(temperature=f32[0], top_k=i64[0], top_p=f32[1], min_p=f32[2], repetition_penalty=f32[3],
                            presence_penalty=f32[4], frequency_penalty=f32[5], seeds=i64[1], positions=i64[2])
        flags = SamplingFlags(all_greedy=all(p.temperature <= 0 for p in ps), top_k=any(p.top_k > 0 for p in ps),
                              top_p=any(p.top_p < 1 for p in ps), min_p=any(p.min_p > 0 for p in ps))
        return t, flags

    def sample(self, logits: torch.Tensor, reqs: Sequence[Request], positions: Sequence[int],
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Row b: request reqs[b]'s token at index positions[b], from logits[b]. Writes `out` [R] int64 if given."""
        # structured output: the constrained rows' allowed tokens (xgrammar on the host, first: the forward is still
        # running on the device), masked before anything else; None when no row is constrained
        allowed = token_bitmask([r.grammar for r in reqs], self.vocab_size, self.device)
        if allowed is not None:
            logits = apply_allowed_mask(logits, allowed)
        t, flags = self.tensors(reqs, positions)
        penalised = [r for r in reqs if uses_penalties(r)]
        if penalised:
            if self.penalties is None:
                self.penalties = PenaltyState(self.num_slots, self.vocab_size, self.device)
            seen, counts = self.penalties.rows(reqs)
            t.seen = seen if any(r.params.repetition_penalty != 1.0 for r in reqs) else None
            t.counts = counts if any(r.params.presence_penalty or r.params.frequency_penalty for r in reqs) else None
        if flags.plain and logits.is_cuda and not backend.reference_enabled():
            from ..kernels.triton_sampling import sample_plain

            ids = sample_plain(apply_penalties(logits, t) if penalised else logits, t.temperature,
                               row_keys(t.seeds, t.positions), out=out)
        else:
            ids = sample(logits, t, flags)
            if out is not None:
                out.copy_(ids)
                ids = out
        if penalised:
            self.penalties.record(reqs, ids)
        if any(r.params.logprobs is not None for r in reqs):
            self._keep_logprobs(logits, reqs, ids)
        return ids

    def _keep_logprobs(self, logits: torch.Tensor, reqs: Sequence[Request], ids: torch.Tensor) -> None:
        """The raw log-probabilities (log_softmax of the model's logits, before temperature and every filter) of
        each asking row's sampled token, its rank, and its `logprobs` most likely tokens, kept on the device until
        the engine reads the step back (pop_logprobs)."""
        rows = [b for b, r in enumerate(reqs) if r.params.logprobs is not None]
        at = to_device(rows, torch.int64, logits.device)
        lp = torch.log_softmax(logits.index_select(0, at).float(), dim=-1)  # [R, V]
        chosen = ids.index_select(0, at).long()
        chosen_lp = lp.gather(1, chosen[:, None])[:, 0]
        rank = (lp > chosen_lp[:, None]).sum(-1) + 1
        k = max(reqs[b].params.logprobs for b in rows)
        top_lp, top_ids = lp.topk(k, dim=-1) if k else (lp[:, :0], chosen[:, None][:, :0])
        for j, b in enumerate(rows):
            r = reqs[b]
            self.logprobs.setdefault(r.request_id, deque()).append(
                (chosen[j], chosen_lp[j], rank[j], top_ids[j, :r.params.logprobs], top_lp[j, :r.params.logprobs]))

    def pop_logprobs(self, request_id: str) -> dict[int, tuple[float, int]]:
        """{token_id: (logprob, rank)} of the request's oldest kept row: its sampled token, then the most likely."""
        chosen, chosen_lp, rank, top_ids, top_lp = (t.tolist() for t in self.logprobs[request_id].popleft())
        out = {chosen: (chosen_lp, rank)}
        for i, (t, v) in enumerate(zip(top_ids, top_lp)):
            out.setdefault(t, (v, i + 1))
        return out

    def forget(self, request_id: str) -> None:
        """Drop what is kept for a finished request (rows of steps whose tokens were dropped)."""
        self.logprobs.pop(request_id, None)

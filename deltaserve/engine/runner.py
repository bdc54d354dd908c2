"""Model runner: turns a SchedulerOutput into one forward call and samples the next tokens.

The scheduler's output is the only message from the scheduler; the ForwardBatch (a model type) is the only message
to the model. Logits are taken only where needed: the last new token of a sequence that samples, and every new
token of a logits_only request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.sampling import SamplingTensors, sample, seed_to_int64, token_statistics
from ..model.cache import HybridCache
from ..model.forward_batch import ForwardBatch
from .request import Request
from .scheduler import SchedulerOutput


@dataclass
class RunnerOutput:
    sampled: dict[str, int]  # request_id -> next token, for the sequences that sample this step
    logits: dict[str, torch.Tensor]  # request_id -> [n, V] fp32 (logits_only requests: all new tokens)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cache: HybridCache, device: torch.device | str = "cpu"):
        self.model = model
        self.cache = cache
        self.device = torch.device(device)
        self.vocab_size = model.config.vocab_size

    def build_batch(self, out: SchedulerOutput) -> tuple[ForwardBatch, list[tuple[Request, slice]]]:
        """The ForwardBatch and, per sequence, which rows of the returned logits belong to it."""
        tokens, ctx, tables, slots, logit_idx, rows = [], [], [], [], [], []
        flat = 0
        for s in out.seqs:
            r = s.request
            tokens.append(r.token_slice(s.start, s.start + s.num_new_tokens))
            ctx.append(s.start)
            tables.append(r.block_table)
            slots.append(r.state_slot)
            first = len(logit_idx)
            if r.logits_only:
                logit_idx.extend(range(flat, flat + s.num_new_tokens))
            elif s.sample:
                logit_idx.append(flat + s.num_new_tokens - 1)
            rows.append((r, slice(first, len(logit_idx))))
            flat += s.num_new_tokens
        batch = ForwardBatch.build(
            tokens, ctx, tables, slots, self.cache.block_size, device=self.device, logits=logit_idx
        )
        return batch, rows

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        batch, rows = self.build_batch(out)
        logits = self.model(batch, self.cache)  # [N, V] fp32
        result = RunnerOutput({}, {})
        to_sample: list[tuple[Request, int]] = []
        for s, (r, sl) in zip(out.seqs, rows):
            if r.logits_only:
                result.logits[r.request_id] = logits[sl].cpu()
            elif s.sample:
                to_sample.append((r, sl.start))
        if to_sample:
            picked = logits[[row for _, row in to_sample]]
            ids = sample(picked, self.sampling_tensors([r for r, _ in to_sample]))
            for (r, _), t in zip(to_sample, ids.tolist()):
                result.sampled[r.request_id] = t
        return result

    def sampling_tensors(self, reqs: list[Request]) -> SamplingTensors:
        def col(values, dtype=torch.float32):
            return torch.tensor(values, dtype=dtype, device=self.device)

        ps = [r.params for r in reqs]
        t = SamplingTensors(
            temperature=col([p.temperature for p in ps]),
            top_k=col([p.top_k for p in ps], torch.int64),
            top_p=col([p.top_p for p in ps]),
            min_p=col([p.min_p for p in ps]),
            repetition_penalty=col([p.repetition_penalty for p in ps]),
            presence_penalty=col([p.presence_penalty for p in ps]),
            frequency_penalty=col([p.frequency_penalty for p in ps]),
            seeds=col([seed_to_int64(r.seed) for r in reqs], torch.int64),
            positions=col([r.num_tokens for r in reqs], torch.int64),  # index of the token being sampled
        )
        uses_rep = any(p.repetition_penalty != 1.0 for p in ps)
        uses_counts = any(p.presence_penalty or p.frequency_penalty for p in ps)
        if uses_rep or uses_counts:
            seen, counts = token_statistics(
                [r.prompt_token_ids for r in reqs], [r.output_token_ids for r in reqs], self.vocab_size, self.device
            )
            t.seen = seen if uses_rep else None
            t.counts = counts if uses_counts else None
        return t

"""Model runner: turns a SchedulerOutput into one forward call and samples the next tokens.

The scheduler's output is the only message from the scheduler; the ForwardBatch (a model type) is the only message
to the model. Logits are taken only where needed: the last new token of a sequence that samples, and every new
token of a logits_only request.

With `graphs` (engine/cuda_graph.DecodeGraphs), a decode-only step (every sequence has one new token and samples,
no logits_only request) of at most the largest bucket's sequences runs through the bucket's CUDA graph; every
other step (prefill, mixed, logits_only, larger batches) runs eagerly. On a device where graphs cannot be captured
the graph path is used only when `graphs_off_device` is set (tests: it then runs the same padded step eagerly).
With `prefill_graphs` (engine/cuda_graph.PrefillGraphs), a step that is one sequence's prefill chunk of a captured
size (the engine's full chunk, max_num_batched_tokens), or B sequences' chunks of one length n with B * n that size,
runs through that (B, n) graph, at any depths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.sampling import SamplingTensors, sample, seed_to_int64, token_statistics
from ..model.cache import HybridCache
from ..model.forward_batch import ForwardBatch
from .cuda_graph import DecodeGraphs, PrefillGraphs
from .request import Request
from .scheduler import SchedulerOutput


@dataclass
class RunnerOutput:
    sampled: dict[str, int]  # request_id -> next token, for the sequences that sample this step
    logits: dict[str, torch.Tensor]  # request_id -> [n, V] fp32 (logits_only requests: all new tokens)


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        cache: HybridCache,
        device: torch.device | str = "cpu",
        graphs: DecodeGraphs | None = None,
        prefill_graphs: PrefillGraphs | None = None,
    ):
        self.model = model
        self.cache = cache
        self.device = torch.device(device)
        self.vocab_size = model.config.vocab_size
        self.graphs = graphs
        self.prefill_graphs = prefill_graphs
        self.graphs_off_device = False  # use the (eager) graph path where capture is impossible: tests on CPU
        # steps run through DecodeGraphs, through PrefillGraphs, eagerly (observability, tests)
        self.graph_steps = 0
        self.prefill_graph_steps = 0
        self.eager_steps = 0

    def _graph_step(self, out: SchedulerOutput) -> bool:
        """Does this step run through the bucketed decode graphs?"""
        g = self.graphs
        if g is None or not (g.capturable or self.graphs_off_device) or g.bucket(len(out.seqs)) is None:
            return False
        if not all(s.num_new_tokens == 1 and s.sample and not s.request.logits_only for s in out.seqs):
            return False
        return g.fits([s.request.block_table for s in out.seqs])

    def _prefill_graph_step(self, out: SchedulerOutput) -> bool:
        """Is this step prefill chunks the prefill graphs serve: one sequence's chunk of a captured size, or several
        sequences' chunks of one length that together make a captured size?"""
        g = self.prefill_graphs
        if g is None or not (g.capturable or self.graphs_off_device) or not out.seqs:
            return False
        if any(s.num_new_tokens < 2 or s.request.logits_only for s in out.seqs):
            return False
        return g.serves([s.num_new_tokens for s in out.seqs], [s.request.block_table for s in out.seqs])

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
        if self._graph_step(out):
            return self._execute_graph(out)
        if self._prefill_graph_step(out):
            return self._execute_prefill_graph(out)
        self.eager_steps += 1
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

    def _execute_graph(self, out: SchedulerOutput) -> RunnerOutput:
        """A decode-only step in the bucket's graph; sampling as in the eager path, on the real rows' logits."""
        self.graph_steps += 1
        reqs = [s.request for s in out.seqs]
        logits = self.graphs.run(
            [r.token_slice(s.start, s.start + 1)[0] for s, r in zip(out.seqs, reqs)],
            [s.start for s in out.seqs],
            [r.block_table for r in reqs],
            [r.state_slot for r in reqs],
        )  # [B, V] fp32, row b = out.seqs[b]
        ids = sample(logits, self.sampling_tensors(reqs))
        return RunnerOutput({r.request_id: t for r, t in zip(reqs, ids.tolist())}, {})

    def _execute_prefill_graph(self, out: SchedulerOutput) -> RunnerOutput:
        """The step's prefill chunks in their (sequences, length) graph; samples as the eager path for each chunk
        that ends its prompt (the graph always computes every chunk's last-token logits; a middle chunk ignores
        them)."""
        self.prefill_graph_steps += 1
        reqs = [s.request for s in out.seqs]
        logits = self.prefill_graphs.run([r.token_slice(s.start, s.start + s.num_new_tokens)
                                          for s, r in zip(out.seqs, reqs)], [s.start for s in out.seqs],
                                         [r.block_table for r in reqs], [r.state_slot for r in reqs])
        picked = [b for b, s in enumerate(out.seqs) if s.sample]
        if not picked:
            return RunnerOutput({}, {})
        ids = sample(logits[picked], self.sampling_tensors([reqs[b] for b in picked]))
        return RunnerOutput({reqs[b].request_id: t for b, t in zip(picked, ids.tolist())}, {})

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

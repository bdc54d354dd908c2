"""Model runner: launches one scheduled step on the device and hands back a handle; the sampled ids are read back
once per step, later, when the engine asks (so the host can schedule the next step while this one runs).

The scheduler's output is the only message from the scheduler; the ForwardBatch (a model type) is the only message
to the model. A step runs in two parts, each row always through the same kernel family whatever else shares the
step (so a request's bits never depend on its neighbours):
  decode   rows of one new token that sample (running requests past their prompt): the bucket's CUDA graph
           (engine/cuda_graph.DecodeGraphs) where there are graphs, else one eager decode forward;
  prefill  prompt chunks (and logits_only requests): each chunk through a captured prefill graph of its length
           (engine/cuda_graph.PrefillGraphs; the scheduler's chunks are multiples of 64 or a prompt's tail under
           it: a small set of lengths), or, where graphs cannot serve, one eager forward of the remaining chunks.
Logits are taken only where needed: the last new token of a sequence that samples, and every new token of a
logits_only request. Sampling (engine/sampler.py) runs on the logits' device; its ids go to a pinned host buffer
and to `last_token[state slot]`, from which the next decode step of that sequence takes its input token on the
device (the engine runs one step ahead of the read-back).

On a device where graphs cannot be captured the graph paths are used only when `graphs_off_device` is set (tests:
the same padded steps run eagerly).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..kernels.sampling import row_keys_host
from ..model.cache import HybridCache
from ..model.forward_batch import ForwardBatch
from . import multimodal
from .cuda_graph import DecodeGraphs, PrefillGraphs
from .request import Request
from .sampler import Sampler, plain_sampling
from .scheduler import ScheduledSeq, SchedulerOutput
from .speculative import SpecPending
from .transfer import to_device

@dataclass
class RunnerOutput:
    sampled: dict[str, int]  # request_id -> next token, for the sequences that sample this step
    logits: dict[str, torch.Tensor]  # request_id -> [n, V] fp32 (logits_only requests: all new tokens)


@dataclass
class StepHandle:
    """A launched step: what it sampled (ids on the device, copied to the host asynchronously) and the logits of
    its logits_only requests. `result()` waits for the copy."""

    sampled_reqs: list[Request] = field(default_factory=list)  # rows of `ids`, in order
    ids: torch.Tensor | None = None  # [R] int64 host tensor (pinned on CUDA), valid once `event` completed
    event: torch.cuda.Event | None = None
    logits: dict[str, torch.Tensor] = field(default_factory=dict)  # logits_only request_id -> [n, V] (device)
    # speculative decoding (engine/speculative.py): each drafting row's new tokens (read back already, or once
    # spec_pending, a step launched through a graph, is finished), and the prompt chunks' final-norm hidden states
    # for the draft source
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)
    spec_pending: SpecPending | None = None
    hidden: dict[str, torch.Tensor] = field(default_factory=dict)
    _result: RunnerOutput | None = None  # read back once (structured output may ask before the engine does)

    def result(self) -> RunnerOutput:
        if self._result is None:
            if self.event is not None:
                self.event.synchronize()
            ids = self.ids.tolist() if self.ids is not None else []
            self._result = RunnerOutput({r.request_id: t for r, t in zip(self.sampled_reqs, ids)},
                                        {rid: lg.cpu() for rid, lg in self.logits.items()})
        return self._result


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
        self.spec = None  # engine/speculative.SpeculativeDecoder when the engine drafts (its decode rows verify)
        self.sampler = Sampler(self.vocab_size, cache.num_state_slots, self.device)
        # the newest sampled token of each state slot's sequence: the input of its next decode step (the decode
        # graphs read the same buffer)
        self.last_token = (graphs.token_source if graphs is not None
                           else torch.zeros(cache.num_state_slots, dtype=torch.int64, device=self.device))
        # steps run through DecodeGraphs, through PrefillGraphs, eagerly (observability, tests)
        self.graph_steps = 0
        self.prefill_graph_steps = 0
        self.eager_steps = 0

    # ---- which path ------------------------------------------------------------------------------------------
    def _graphs_usable(self, g) -> bool:
        return g is not None and (g.capturable or self.graphs_off_device)

    def _decode_by_graph(self, rows: list[ScheduledSeq]) -> bool:
        g = self.graphs
        return self._graphs_usable(g) and g.bucket(len(rows)) is not None and g.fits(
            [s.request.block_table for s in rows])

    # ---- the step --------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def launch(self, out: SchedulerOutput, before_sampling: Callable[[], None] | None = None) -> StepHandle:
        """Run the step's forwards and sampling on the device; nothing here waits for the device, except
        `before_sampling` (structured output's: the matchers take the previous step's tokens), called once after the
        first forward is launched and before the first sampling, so it overlaps that forward."""
        hooks = [before_sampling] if before_sampling is not None else []
        is_decode = [s.num_new_tokens - s.num_drafts == 1 and s.sample and not s.request.in_prefill for s in out.seqs]
        decode = [s for s, d in zip(out.seqs, is_decode) if d]
        prefill = [s for s, d in zip(out.seqs, is_decode) if not d]
        handle = StepHandle()
        ids_parts: list[torch.Tensor] = []
        graph_sampled = False  # the decode part's ids came from its graph, which wrote last_token for them too
        if decode and self.spec is not None:
            # (speculative.MAX_VERIFY_ROWS, and with graphs only what a step graph serves: else none is left)
            self.spec.trim(decode, self._graphs_usable(self.graphs))
        if decode and self.spec is not None and any(s.request.draft_token_ids for s in decode):
            # verify the drafts (a decode step for rows without); the engine reads the step back before scheduling
            # the next (it may launch the next drafting step of the same rows first: SpeculativeDecoder.follow)
            while hooks:
                hooks.pop()()
            done = self.spec.run(decode, self.cache.block_size, self._graphs_usable(self.graphs))
            if isinstance(done, SpecPending):
                handle.spec_pending = done
            else:
                handle.spec_tokens = done.tokens
            decode = []
        if decode:
            reqs = [s.request for s in decode]
            logits, ids = self._decode(decode)  # [Bd, V]; the graph's own plain sampling, when it serves the rows
            graph_sampled = ids is not None
            if ids is None:
                while hooks:
                    hooks.pop()()
                ids = self.sampler.sample(logits, reqs, [r.num_tokens for r in reqs])
            ids_parts.append(ids)
            handle.sampled_reqs += reqs
        if prefill:
            reqs, logits = self._prefill(prefill, handle)
            if reqs:
                while hooks:
                    hooks.pop()()
                ids_parts.append(self.sampler.sample(logits, reqs, [r.num_tokens for r in reqs]))
                handle.sampled_reqs += reqs
            if self.spec is not None:  # the draft source sees the prompt's pairs, and drafts after the last chunk
                first = {r.request_id: ids_parts[-1][j] for j, r in enumerate(reqs)} if reqs else {}
                self.spec.observe_prompt([(s, handle.hidden.pop(s.request.request_id, None)) for s in prefill
                                          if not s.request.logits_only], first)
        if handle.sampled_reqs:
            ids = ids_parts[0] if len(ids_parts) == 1 else torch.cat(ids_parts)
            if not (graph_sampled and len(ids_parts) == 1):  # (else the graph wrote its rows' tokens already)
                slots = to_device([r.state_slot for r in handle.sampled_reqs], torch.int64, self.device)
                self.last_token.index_copy_(0, slots, ids)
            if ids.is_cuda:
                handle.ids = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
                handle.ids.copy_(ids, non_blocking=True)
                handle.event = torch.cuda.Event()
                handle.event.record()
            else:
                handle.ids = ids.clone()  # (a graph's static buffer: the next step overwrites it)
        return handle

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        """launch + result: one step, waited for (tests, tools)."""
        return self.launch(out).result()

    # ---- decode part -----------------------------------------------------------------------------------------
    def _decode_inputs(self, rows: list[ScheduledSeq]) -> tuple[list[int], list[int]]:
        """(token ids, from_device flags): a row whose input token is still pending on the device takes it from
        last_token[slot] (flag 1, id 0 here)."""
        ids, pending = [], []
        for s in rows:
            r = s.request
            if r.num_pending:
                ids.append(0)
                pending.append(1)
            else:
                ids.append(r.token_slice(s.start, s.start + 1)[0])
                pending.append(0)
        return ids, pending

    def _decode(self, rows: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [B, V] fp32, sampled ids [B] or None) of a decode step of the rows. Through a graph the logits are
        a view of its static output (sample them before its next replay), and the graph has sampled the rows the
        plain way: those ids serve when every row is plain (greedy or temperature, no penalties), else None."""
        reqs = [s.request for s in rows]
        ids, pending = self._decode_inputs(rows)
        if self._decode_by_graph(rows):
            self.graph_steps += 1
            plain = all(plain_sampling(r.params) and r.grammar is None for r in reqs)  # (a grammar masks first)
            temps = [r.params.temperature for r in reqs] if plain else None
            keys = row_keys_host([r.seed for r in reqs], [r.num_tokens for r in reqs]) if plain else None
            positions = multimodal.decode_positions(rows)  # requests with images: cache index + rope_delta
            logits = self.graphs.run(ids, [s.start for s in rows], [r.block_table for r in reqs],
                                     [r.state_slot for r in reqs], epochs=[r.slot_epoch for r in reqs],
                                     from_device=pending, temperature=temps, keys=keys, positions=positions)
            return logits, (self.graphs.last_sampled if plain else None)
        self.eager_steps += 1
        batch = ForwardBatch.build([[t] for t in ids], [s.start for s in rows], [r.block_table for r in reqs],
                                   [r.state_slot for r in reqs], self.cache.block_size, device=self.device)
        multimodal.apply_to_batch(batch, rows)  # requests with images: their rope_delta-shifted positions
        if any(pending):
            flags = to_device(pending, torch.bool, self.device)
            batch.input_ids = torch.where(flags, self.last_token.index_select(0, batch.state_slots), batch.input_ids)
        return self.model(batch, self.cache), None

    # ---- prefill part ----------------------------------------------------------------------------------------
    def _prefill(self, chunks: list[ScheduledSeq], handle: StepHandle) -> tuple[list[Request], torch.Tensor | None]:
        """Run the prompt chunks; returns the requests that sample and their last-token logits [n, V]."""
        sampled: list[tuple[Request, torch.Tensor]] = []
        eager: list[ScheduledSeq] = []
        g = self.prefill_graphs
        if self.spec is not None and self.spec.source is not None and self.spec.source.needs_hidden:
            g = None  # the draft source needs the chunks' hidden states: the eager forward gives them
        if self._graphs_usable(g) and self._prefill_as_one_graph(chunks):
            self.prefill_graph_steps += 1
            reqs = [s.request for s in chunks]
            logits = g.run([r.token_slice(s.start, s.start + s.num_new_tokens) for s, r in zip(chunks, reqs)],
                           [s.start for s in chunks], [r.block_table for r in reqs], [r.state_slot for r in reqs])
            sampled = [(s.request, logits[b:b + 1]) for b, s in enumerate(chunks) if s.sample]
        else:
            for s in chunks:
                if (self._graphs_usable(g) and not s.request.logits_only and s.request.mm is None
                        and self._prefill_graph(s, sampled)):
                    continue
                eager.append(s)
        if eager:
            self.eager_steps += 1
            sampled += self._prefill_eager(eager, handle)
        if not sampled:
            return [], None
        logits = sampled[0][1] if len(sampled) == 1 else torch.cat([lg for _, lg in sampled])
        return [r for r, _ in sampled], logits

    def _prefill_as_one_graph(self, chunks: list[ScheduledSeq]) -> bool:
        """Several sequences' chunks of one length making a captured step size: one batched prefill graph."""
        if len(chunks) < 2 or any(s.request.logits_only or s.num_new_tokens < 2 for s in chunks):
            return False
        if multimodal.has_images(chunks):  # image features and 3-D positions: the eager forward
            return False
        return self.prefill_graphs.serves([s.num_new_tokens for s in chunks], [s.request.block_table for s in chunks])

    def _prefill_graph(self, s: ScheduledSeq, sampled: list) -> bool:
        """One sequence's chunk through the prefill graph of its length (the scheduler's chunks are multiples of
        its alignment or a prompt's tail under it, so the lengths are few). False when the graphs cannot take it
        (the chunk then runs eagerly)."""
        g = self.prefill_graphs
        r = s.request
        if not g.can_run(s.num_new_tokens, len(r.block_table)):
            return False
        self.prefill_graph_steps += 1
        logits = g.run([r.token_slice(s.start, s.start + s.num_new_tokens)], [s.start], [r.block_table],
                       [r.state_slot])
        if s.sample:
            sampled.append((r, logits))
        return True

    def _prefill_eager(self, chunks: list[ScheduledSeq], handle: StepHandle) -> list[tuple[Request, torch.Tensor]]:
        tokens, logit_idx, rows = [], [], []
        flat = 0
        for s in chunks:
            r = s.request
            tokens.append(r.token_slice(s.start, s.start + s.num_new_tokens))
            first = len(logit_idx)
            if r.logits_only:
                logit_idx.extend(range(flat, flat + s.num_new_tokens))
            elif s.sample:
                logit_idx.append(flat + s.num_new_tokens - 1)
            rows.append((s, first, len(logit_idx)))
            flat += s.num_new_tokens
        reqs = [s.request for s in chunks]
        batch = ForwardBatch.build(tokens, [s.start for s in chunks], [r.block_table for r in reqs],
                                   [r.state_slot for r in reqs], self.cache.block_size, device=self.device,
                                   logits=logit_idx)
        multimodal.apply_to_batch(batch, chunks)  # requests with images: 3-D positions, image features
        if self.spec is not None and self.spec.source is not None and self.spec.source.needs_hidden:
            # forward's logits (the same calls: hidden states, then compute_logits of the picked rows), and every
            # row's final-norm hidden state for the draft source
            hidden = self.model.hidden_states(batch, self.cache)
            picked = hidden if batch.logits_all_rows else hidden[batch.logits_indices]
            logits = self.model.compute_logits(picked, decode=batch.decode_rows)
            normed = self.model.norm(hidden)
            for s, start in zip(chunks, batch.cu_seqlens_cpu.tolist()):
                handle.hidden[s.request.request_id] = normed[start: start + s.num_new_tokens]
        else:
            logits = self.model(batch, self.cache)  # [N, V] fp32
        sampled = []
        for s, lo, hi in rows:
            if s.request.logits_only:
                handle.logits[s.request.request_id] = logits[lo:hi]
            elif s.sample:
                sampled.append((s.request, logits[lo:hi]))
        return sampled

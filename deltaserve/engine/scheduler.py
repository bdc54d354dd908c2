"""Continuous-batching scheduler: decides which tokens of which requests run in the next forward call.

One step: every running request past its prompt decodes one token; then prompt chunks of running requests, then
waiting requests admitted in arrival order while a state slot, the token budget and memory allow. The budget
(max_num_batched_tokens) counts decode and prompt tokens, but a step always may compute one aligned chunk of a
prompt, so neither side starves the other.

No preemption: a request is admitted only when the free KV blocks, less those already promised to running
requests, cover its whole life (prompt + max_tokens), so a running request never runs out of blocks. Blocks are
still allocated lazily (`may_append`) as tokens are computed.

Chunked prefill, exact by construction: a prompt is cut only at multiples of `align` (lcm(block size, 64): the
chunked DeltaNet's chunk length), and its unaligned tail is always a chunk of its own. So the chunks a prompt is
computed in depend on the prompt alone (where the budget falls only decides how many aligned pieces go together,
which does not change a bit), whether it runs alone or beside 63 others, and whether it starts fresh or resumes
from the prefix cache at an aligned seam (engine/prefix_cache.py).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field

from .block_pool import BlockPool, StateSlotPool
from .prefix_cache import ALIGN_TOKENS, PrefixCache
from .request import FinishReason, Request, RequestStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 8  # running requests (= DeltaNet state slots in use)
    max_num_batched_tokens: int = 512  # tokens per forward call
    max_model_len: int = 4096  # prompt + output tokens per request

    def validate(self, block_size: int) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, found {getattr(self, name)}")
        if self.max_num_batched_tokens < block_size:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least block_size ({block_size}) "
                "so that a block-aligned prefill chunk always fits"
            )


@dataclass
class ScheduledSeq:
    request: Request
    start: int  # tokens already in the cache (= the new tokens' first cache index)
    num_new_tokens: int
    sample: bool  # the chunk reaches the end of the known tokens: a next token is sampled from its last logits
    num_drafts: int = 0  # speculative decoding: the last num_drafts new tokens are drafts to verify


@dataclass
class SchedulerOutput:
    seqs: list[ScheduledSeq] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.seqs)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockPool, slots: StateSlotPool,
                 prefix: PrefixCache | None = None):
        config.validate(blocks.block_size)
        self.config = config
        self.blocks = blocks
        self.slots = slots
        self.prefix = prefix
        self.align = math.lcm(blocks.block_size, ALIGN_TOKENS)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._epochs = itertools.count()

    # ---- admission control ---------------------------------------------------------------------------------
    def blocks_needed(self, req: Request) -> int:
        """Blocks the request holds at most over its life."""
        return self.blocks.blocks_for(req.max_total_tokens)

    def check_fits(self, req: Request) -> None:
        """Refuse at add time a request that could never be admitted (clear error instead of waiting forever)."""
        need = self.blocks_needed(req)
        if need > self.blocks.num_blocks:
            raise ValueError(
                f"request {req.request_id}: prompt ({req.num_prompt_tokens} tokens) + max_tokens ({req.max_tokens}) "
                f"needs {need} KV blocks of {self.blocks.block_size} tokens, the cache has {self.blocks.num_blocks}; "
                "lower max_tokens or raise num_blocks"
            )

    def reserved_blocks(self) -> int:
        """Blocks promised to running requests but not yet allocated."""
        return sum(self.blocks_needed(r) - len(r.block_table) for r in self.running)

    def can_admit(self, req: Request, shared: list[int] = ()) -> bool:
        """Room for the request, given the cached blocks it would share (they need no new block, but those nobody
        holds now stop being free when shared)."""
        if len(self.running) >= self.config.max_num_seqs or not self.slots.can_allocate():
            return False
        free = self.blocks.num_free - self.blocks.num_evictable_among(list(shared)) - self.reserved_blocks()
        return free >= self.blocks_needed(req) - len(shared)

    # ---- the step --------------------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.check_fits(req)
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def prefill_chunk(self, req: Request, budget: int, start: int | None = None, seams=None) -> int:
        """New prompt tokens to compute now (0: none this step), from `start` (default: what is computed). The
        chunk ends at the prompt's end, or at the last multiple of `align` the budget reaches (and never past the
        request's next snapshot seam); a prompt's unaligned tail is a chunk of its own. A budget that reaches no
        aligned position gives 0."""
        start = req.num_computed_tokens if start is None else start
        p = req.num_prompt_tokens
        end = min(p, start + budget)
        seam = next((x for x in (req.seams if seams is None else seams) if x > start), None)
        if seam is not None:
            end = min(end, seam)
        aligned = end // self.align * self.align
        if end < p:
            end = aligned if aligned > start else start
        elif start < aligned < p:
            end = aligned  # the tail after the last aligned position: the next chunk
        return end - start

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        for req in self.running:  # decodes: one token each (and its drafts), unless outputs reach max_tokens
            if not req.in_prefill and not req.logits_only and req.num_outputs < req.max_tokens:
                drafts = len(req.draft_token_ids)
                out.seqs.append(self._scheduled(req, 1 + drafts, drafts))
        # prompt tokens: what the budget leaves, but at least one aligned chunk a step
        budget = max(self.config.max_num_batched_tokens - out.num_tokens, self.align)
        for req in self.running:
            if budget <= 0:
                break
            if req.in_prefill:
                n = self.prefill_chunk(req, budget)
                if n:
                    out.seqs.append(self._scheduled(req, n))
                    budget -= n
        while self.waiting and budget > 0:
            req = self.waiting[0]
            cached = self.prefix is not None and not req.logits_only
            match = self.prefix.match(req) if cached else None
            if not self.can_admit(req, match.blocks if match else ()):
                break
            seams = self.prefix.seams(req, req.snapshot_hints) if cached else []
            n = self.prefill_chunk(req, budget, match.tokens if match else 0, seams)
            if n == 0:  # what the budget leaves reaches no aligned position: next step
                break
            self._admit(req, match, seams)
            out.seqs.append(self._scheduled(req, n))
            budget -= n
        for s in out.seqs:
            self.blocks.may_append(s.request.block_table, s.start + s.num_new_tokens)
        return out

    def _admit(self, req: Request, match, seams: list[int]) -> None:
        """Move the head of the queue to running: a state slot, and the prefix cache's blocks and snapshot."""
        self.waiting.popleft()
        req.status = RequestStatus.RUNNING
        req.state_slot = self.slots.allocate()
        req.slot_epoch = next(self._epochs)
        req.seams = seams
        self.running.append(req)
        if match is None:
            return
        self.prefix.queries += req.num_prompt_tokens
        if match.tokens:
            for b in match.blocks:
                self.blocks.share(b)
            req.block_table = list(match.blocks)
            req.num_registered_blocks = len(match.blocks)
            req.num_computed_tokens = req.metrics.num_cached_tokens = match.tokens
            req.resume_snapshot = match.snapshot
            self.prefix.hits += match.tokens

    def _scheduled(self, req: Request, n: int, drafts: int = 0) -> ScheduledSeq:
        start = req.num_computed_tokens
        reaches_end = start + n - drafts == req.num_tokens
        return ScheduledSeq(req, start, n, sample=reaches_end and not req.logits_only, num_drafts=drafts)

    def update(self, out: SchedulerOutput) -> None:
        """Record that the scheduled tokens are now in the cache (drafts not: the engine counts those accepted)."""
        for s in out.seqs:
            s.request.num_computed_tokens = s.start + s.num_new_tokens - s.num_drafts

    def finish(self, req: Request, reason: FinishReason) -> None:
        """Finish a request (running or waiting) and give back its blocks and state slot."""
        if req.is_finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.block_table:
            self.blocks.free(req.block_table)
            req.block_table = []
        if req.state_slot >= 0:
            self.slots.free(req.state_slot)
            req.state_slot = -1
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason

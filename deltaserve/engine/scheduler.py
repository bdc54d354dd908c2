"""Continuous-batching scheduler: decides which tokens of which requests run in the next forward call.

One step: running requests first (one decode token each, or their next prefill chunk), then waiting requests
are admitted in arrival order while a state slot, the token budget and memory allow.

No preemption: a request is admitted only when the free KV blocks, less those already promised to running
requests, cover its whole life (prompt + max_tokens), so a running request never runs out of blocks. Blocks are
still allocated lazily (`may_append`) as tokens are computed.

Chunked prefill: a chunk that does not finish the prompt ends on a block boundary, so every chunk of a prompt
starts at a multiple of block_size (the exactness principle: chunked == whole, and prefix-cache hits line up).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from .block_pool import BlockPool, StateSlotPool
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
    def __init__(self, config: SchedulerConfig, blocks: BlockPool, slots: StateSlotPool):
        config.validate(blocks.block_size)
        self.config = config
        self.blocks = blocks
        self.slots = slots
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

    def can_admit(self, req: Request) -> bool:
        if len(self.running) >= self.config.max_num_seqs or not self.slots.can_allocate():
            return False
        return self.blocks.num_free - self.reserved_blocks() >= self.blocks_needed(req)

    # ---- the step --------------------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.check_fits(req)
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def prefill_chunk(self, req: Request, budget: int) -> int:
        """New prompt tokens to compute now: all that remain if they fit, else the most that end on a block edge."""
        remaining = req.num_prompt_tokens - req.num_computed_tokens
        n = min(remaining, budget)
        if n < remaining:
            bs = self.blocks.block_size
            n = (req.num_computed_tokens + n) // bs * bs - req.num_computed_tokens
        return max(n, 0)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        for req in self.running:
            if budget <= 0:
                break
            if req.in_prefill:
                n = self.prefill_chunk(req, budget)
            elif req.logits_only:  # its prompt is done: it finishes when that step is read back
                n = 0
            else:  # one decode token, unless its outputs (pending ones too) already reach max_tokens
                n = int(req.num_outputs < req.max_tokens)
            if n:
                out.seqs.append(self._scheduled(req, n))
                budget -= n
        while self.waiting and budget > 0 and self.can_admit(self.waiting[0]):
            req = self.waiting[0]
            n = self.prefill_chunk(req, budget)
            if n == 0:
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            req.state_slot = self.slots.allocate()
            req.slot_epoch = next(self._epochs)
            self.running.append(req)
            out.seqs.append(self._scheduled(req, n))
            budget -= n
        for s in out.seqs:
            self.blocks.may_append(s.request.block_table, s.start + s.num_new_tokens)
        return out

    def _scheduled(self, req: Request, n: int) -> ScheduledSeq:
        start = req.num_computed_tokens
        reaches_end = start + n == req.num_tokens
        return ScheduledSeq(req, start, n, sample=reaches_end and not req.logits_only)

    def update(self, out: SchedulerOutput) -> None:
        """Record that the scheduled tokens are now in the cache."""
        for s in out.seqs:
            s.request.num_computed_tokens = s.start + s.num_new_tokens

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

"""Request: one sequence's prompt, parameters, progress through the cache and outputs (engine-owned, mutable)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from ..structured.matcher import RequestGrammar
from .sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # not admitted: owns no blocks and no state slot
    RUNNING = "running"  # admitted: owns a state slot and the blocks for its computed tokens
    FINISHED = "finished"  # resources given back


class FinishReason(str, enum.Enum):
    STOP = "stop"  # an end-of-sequence token, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the model's context length
    ABORT = "abort"


@dataclass
class RequestMetrics:
    arrival: float = 0.0  # time.perf_counter() at add_request
    first_scheduled: float | None = None
    first_token: float | None = None  # when the prefill produced the first output token
    finished: float | None = None
    num_cached_tokens: int = 0  # prompt tokens that came from the prefix cache
    # speculative decoding (engine/speculative.py): drafts verified, drafts accepted, drafting steps
    num_drafted: int = 0
    num_accepted: int = 0
    num_spec_steps: int = 0

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens a drafting step gave this request on average (accepted drafts + the target's own); None if it
        never drafted."""
        return (self.num_accepted + self.num_spec_steps) / self.num_spec_steps if self.num_spec_steps else None

    @property
    def prefill_seconds(self) -> float | None:
        if self.first_scheduled is None or self.first_token is None:
            return None
        return self.first_token - self.first_scheduled

    @property
    def decode_seconds(self) -> float | None:
        if self.first_token is None or self.finished is None:
            return None
        return self.finished - self.first_token


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    seed: int = 0  # resolved at admission: params.seed, or a draw from the engine's RNG
    max_tokens: int = 1  # resolved at add_request: params.max_tokens clipped to the context length
    # logits_only: compute next-token logits at every prompt position and finish without sampling (LLM.logits).
    logits_only: bool = False
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens sampled by launched steps whose ids are not read back yet (the engine runs one step ahead): they count
    # in num_tokens, and the next decode step takes the newest one from the device (runner.last_token).
    num_pending: int = 0
    num_computed_tokens: int = 0  # tokens whose K/V and DeltaNet state are in the cache
    block_table: list[int] = field(default_factory=list)
    state_slot: int = -1
    slot_epoch: int = -1  # a number unique to this admission (the runner's per-slot caches tell holders apart by it)
    all_logits: list[torch.Tensor] = field(default_factory=list)  # logits_only: [n, V] chunks in order
    # prefix cache (engine/prefix_cache.py)
    cache_salt: bytes = b""  # mixed into the request's block hashes (content that changes the KV: e.g. images)
    snapshot_hints: list[int] = field(default_factory=list)  # prompt positions worth a snapshot (message ends)
    seams: list[int] = field(default_factory=list)  # where its prompt snapshots its state (and chunks end)
    block_hashes: list[bytes] = field(default_factory=list)  # hash chain of its full blocks, as far as computed
    num_registered_blocks: int = 0  # leading blocks of block_table registered in the cache (or shared from it)
    resume_snapshot: int | None = None  # snapshot to load into the state slot before its first chunk
    grammar: RequestGrammar | None = None  # structured output: its matcher (engine/structured.py attaches it)
    # SamplingParams.logprobs: per read-back output token {token_id: Logprob} (engine/outputs.py)
    output_logprobs: list[dict] = field(default_factory=list)
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    mm: Any = None  # engine.multimodal.RequestImages of a request with images (3-D positions, features); else None
    draft_token_ids: list[int] = field(default_factory=list)  # speculative decoding: drafts its next step verifies
    drafting_off: bool = False  # speculative decoding switched off for this request (its drafts were rarely right)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt, read-back outputs and pending outputs: the index the next sampled token will have."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_pending

    @property
    def num_outputs(self) -> int:
        """Output tokens sampled so far, pending ones included."""
        return len(self.output_token_ids) + self.num_pending

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def max_total_tokens(self) -> int:
        """Most tokens this request can ever hold in the cache (the last sampled token is never fed back)."""
        if self.logits_only:
            return self.num_prompt_tokens
        return self.num_prompt_tokens + self.max_tokens - 1

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    @property
    def in_prefill(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    def token_slice(self, start: int, end: int) -> list[int]:
        """Known token ids of positions start .. end-1 (a prompt chunk, or read-back outputs): O(end - start)."""
        p = self.num_prompt_tokens
        if end <= p:
            return self.prompt_token_ids[start:end]
        if end > p + len(self.output_token_ids):
            raise ValueError(f"request {self.request_id}: tokens up to {end} asked, {p + len(self.output_token_ids)} "
                             "known (the rest are pending on the device)")
        head = self.prompt_token_ids[start:p] if start < p else []
        return head + self.output_token_ids[max(start - p, 0): end - p]

"""The one contract between the engine and the model.

A forward call is "some new tokens for some sequences". Prefill, chunked prefill, decode, prefix-cache resumes and
draft verification are all the same call with different token counts. The engine fills a `ForwardBatch` (a type
the model owns) and passes it with the `HybridCache`; the model never imports engine types.

Layout of one call with B sequences and T = sum(new tokens):

  input_ids      [T]  int64   new tokens, sequence after sequence
  positions      [T]  int64   RoPE position of each token (text); or [3, T] for multimodal (T/H/W ids)
  cu_seqlens     [B+1] int64  sequence b's new tokens are input_ids[cu_seqlens[b]:cu_seqlens[b+1]]
  context_lens   [B]  int64   tokens already in the cache for sequence b before this call
  block_tables   [B, max_blocks] int32  paged-KV blocks of sequence b (padded with -1)
  slot_mapping   [T]  int64   flat KV slot (block * block_size + offset) where each new token's K/V is written
  state_slots    [B]  int64   slot of sequence b's DeltaNet conv + recurrent state in the state pool
  logits_indices [N]  int64   which of the T tokens get logits (default: the last new token of each sequence)
  logits_all_rows     bool    host flag: logits_indices == arange(T) (every token, in order; a decode step)
  embeds_rows    [M]  int64   optional: rows of the T tokens whose input embedding is replaced (image tokens) ...
  embeds         [M, H]       ... by these rows (vision features), instead of the token embedding

Speculative verification (verify=True): every new token is a DECODE ROW. Token i of sequence b (the last sampled
token, then the drafts) gets the bits a one-token decode step at cache index context_lens[b] + i would give it
after tokens 0 .. i-1 were decoded; the decode kernels serve it, each attention row reading its own length:
  row_context_lens  [T]  int64   context_lens[b] + i of each row
  row_block_tables  [T, max_blocks] int32  the row's sequence's block table (as wide as its decode steps' tables:
                                          the width sizes the attention's split grid, part of a row's bits)
The DeltaNet state of a sequence of several rows is NOT advanced by the forward: the engine calls
`model.commit_verified(batch, cache, keep)` with the rows to keep once the acceptance is known (until then the
slots of such sequences are unspecified). A sequence of one row is an ordinary decode step.

Invariants: a sequence with context_len == 0 starts from a zero DeltaNet state whatever its slot holds (so the
engine never has to clear slots); cache index of new token i of sequence b is context_lens[b] + i.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    state_slots: torch.Tensor
    logits_indices: torch.Tensor
    # Host copies so the reference path and the schedulers never synchronise with the device.
    seq_lens_cpu: list[int]  # new tokens per sequence
    context_lens_cpu: list[int]
    block_size: int
    # Host fact: logits_indices is arange(T) (every token gets logits, in order: a decode step), so the model reads
    # the hidden states as they are instead of gathering them (one launch fewer per step).
    logits_all_rows: bool = False
    # Multimodal: token rows whose embedding is given (image features) rather than looked up; None for text.
    embeds_rows: torch.Tensor | None = None
    embeds: torch.Tensor | None = None
    verify: bool = False  # host flag: every token a decode row (speculative verification; see the module doc)
    row_context_lens: torch.Tensor | None = None  # [T], verify only
    row_block_tables: torch.Tensor | None = None  # [T, max_blocks], verify only
    # What a kernel wrapper makes once per batch and must keep alive for as long as the batch lives (fla's chunk
    # index: kernels/gated_delta/triton_decode.gdn_prefill(memo=)); a captured graph keeps its batch, so its
    # replays read live tensors.
    memo: dict = field(default_factory=dict)

    @property
    def decode_rows(self) -> bool:
        """Every token runs the decode kernels as a row of its own: a decode step, or a verification."""
        return self.verify or self.max_seqlen == 1

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @functools.cached_property
    def cu_seqlens_cpu(self) -> torch.Tensor:
        """cu_seqlens on the host (from seq_lens_cpu), for kernels that would otherwise copy it back (a sync).
        One tensor per batch: fla caches its chunk indices by the identity of this argument across layers."""
        out, total = [0], 0
        for n in self.seq_lens_cpu:
            total += n
            out.append(total)
        return torch.tensor(out, dtype=torch.int64)

    @property
    def max_seqlen(self) -> int:
        """Most new tokens of any sequence (1 for a pure decode step); a host size, never a device read."""
        return max(self.seq_lens_cpu)

    @classmethod
    def build(
        cls,
        token_ids: Sequence[Sequence[int]],
        context_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        state_slots: Sequence[int],
        block_size: int,
        device: torch.device | str = "cpu",
        positions: Sequence[Sequence[int]] | None = None,
        logits: str | Sequence[int] = "last",
        verify: bool = False,
    ) -> "ForwardBatch":
        """Build a batch from plain lists.

        token_ids[b]    the new tokens of sequence b (at least one each)
        context_lens[b] tokens of b already cached; the new ones occupy cache indices context_lens[b] + i
        block_tables[b] the KV blocks of b, enough to hold context_lens[b] + len(token_ids[b]) tokens
        positions[b]    RoPE positions of the new tokens (default: their cache indices)
        logits          "last" (last new token of each sequence), "all", or explicit flat token indices
        verify          every token a decode row (speculative verification): fills row_context_lens and
                        row_block_tables
        """
        n = len(token_ids)
        if not (len(context_lens) == len(block_tables) == len(state_slots) == n):
            raise ValueError("token_ids, context_lens, block_tables and state_slots must have one entry per sequence")
        seq_lens = [len(t) for t in token_ids]
        if any(s == 0 for s in seq_lens):
            raise ValueError("every sequence in a forward batch needs at least one new token")
        flat_ids: list[int] = []
        flat_pos: list[int] = []
        slots: list[int] = []
        for b in range(n):
            start = context_lens[b]
            end = start + seq_lens[b]
            table = block_tables[b]
            if len(table) * block_size < end:
                raise ValueError(
                    f"sequence {b}: block table holds {len(table) * block_size} tokens, needs {end}"
                )
            flat_ids.extend(token_ids[b])
            flat_pos.extend(positions[b] if positions is not None else range(start, end))
            slots.extend(table[i // block_size] * block_size + i % block_size for i in range(start, end))
        cu = [0]
        for s in seq_lens:
            cu.append(cu[-1] + s)
        if logits == "last":
            logit_idx = [c - 1 for c in cu[1:]]
        elif logits == "all":
            logit_idx = list(range(cu[-1]))
        else:
            logit_idx = list(logits)
        max_blocks = max(1, max(len(t) for t in block_tables))
        tables = torch.full((n, max_blocks), -1, dtype=torch.int32)
        for b, t in enumerate(block_tables):
            if len(t):
                tables[b, : len(t)] = torch.tensor(list(t), dtype=torch.int32)

        def as_tensor(x, dtype=torch.int64):
            return torch.tensor(x, dtype=dtype, device=device)

        row_seq = [b for b in range(n) for _ in range(seq_lens[b])]
        row_ctx = [context_lens[b] + i for b in range(n) for i in range(seq_lens[b])]
        return cls(
            input_ids=as_tensor(flat_ids),
            positions=as_tensor(flat_pos),
            cu_seqlens=as_tensor(cu),
            context_lens=as_tensor(list(context_lens)),
            block_tables=tables.to(device),
            slot_mapping=as_tensor(slots),
            state_slots=as_tensor(list(state_slots)),
            logits_indices=as_tensor(logit_idx),
            seq_lens_cpu=seq_lens,
            context_lens_cpu=list(context_lens),
            block_size=block_size,
            logits_all_rows=logit_idx == list(range(cu[-1])),
            verify=verify,
            row_context_lens=as_tensor(row_ctx) if verify else None,
            row_block_tables=tables[row_seq].to(device) if verify else None,
        )

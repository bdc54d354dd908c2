"""The Qwen3.5 / Qwen3.6 (and Qwen3-Next) causal language model; reads top to bottom.

Parameter names are the published Hugging Face names without the `model.language_model.` prefix
(`embed_tokens.weight`, `layers.N.linear_attn.in_proj_qkv.weight`, `layers.N.mlp.experts.gate_up_proj`, `norm.weight`,
`lm_head.weight`); the loader maps every checkpoint format onto them.
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.rope import rope_cos_sin
from . import fast
from .cache import HybridCache
from .config import ModelConfig
from .decoder_layer import DecoderLayer
from .forward_batch import ForwardBatch
from .layers import DenseWeights, WeightFactory
from .mtp import MTPHead, mtp_cache_layer
from .norm import RMSNorm
from .parallel import SINGLE, Parallel


class Qwen3_5ForCausalLM(nn.Module):
    """forward(batch, cache) -> fp32 logits [N, vocab] for the tokens batch.logits_indices selects.

    mtp_layers > 0: the model also holds the MTP draft head (`self.mtp`, model/mtp.py; None without it), run by
    `draft`; `forward_with_hidden` gives the target's final-norm hidden states it starts from. parallel: this
    instance's rank among tensor-parallel ranks (model/parallel.py); config and weights are then the rank's
    (model/tp_layout.py, weights/shard.py)."""

    def __init__(self, config: ModelConfig, weights: WeightFactory | None = None, norm_offset: float = 1.0,
                 mtp_layers: int = 0, parallel: Parallel = SINGLE):
        super().__init__()
        weights = weights or DenseWeights()
        self.config = config
        self.parallel = parallel
        self.embed_tokens = weights.embedding("embed_tokens", config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(i, config, weights, norm_offset, parallel=parallel)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, norm_offset)
        self.lm_head = None
        if not config.tie_word_embeddings:
            self.lm_head = weights.linear("lm_head", config.hidden_size, config.vocab_size)
        fast.mark_output_head(self.lm_head if self.lm_head is not None else self.embed_tokens)
        self.mtp = MTPHead(config, weights, norm_offset, mtp_layers) if mtp_layers > 0 else None

    def fuse_projections(self) -> int:
        """Fuse the projections that share an input into one weight each (model/fusion.py); idempotent."""
        from .fusion import fuse_projections

        return fuse_projections(self)

    def make_cache(
        self, num_blocks: int, block_size: int, num_state_slots: int, dtype: torch.dtype | None = None, device=None,
        kv_dtype: torch.dtype | None = None, num_snapshots: int = 0, mtp: bool = False,
    ) -> HybridCache:
        """kv_dtype: None (the activation dtype) or torch.float8_e4m3fn (cache.parse_kv_cache_dtype); num_snapshots:
        DeltaNet state snapshots for the prefix cache; mtp: also the MTP head's KV (one more attention layer per MTP
        layer, same blocks), for drafting."""
        if mtp and self.mtp is None:
            raise ValueError("make_cache(mtp=True): this model was loaded without an MTP head")
        p = self.norm.weight
        return HybridCache(self.config, num_blocks, block_size, num_state_slots, dtype or p.dtype, device or p.device,
                           kv_dtype, num_snapshots, mtp_layers=self.mtp.num_layers if mtp else 0)

    def hidden_states(self, batch: ForwardBatch, cache: HybridCache) -> torch.Tensor:
        """Hidden states [T, H] of every new token after the last layer, before the final norm."""
        cfg = self.config
        if batch.verify and not fast.enabled(self.norm.weight):
            return self._verify_reference(batch, cache)[0]
        # the forward's first kernel: launched without PDL (vocabulary-parallel under tensor parallelism)
        x = self.parallel.embed(lambda ids: fast.embed(self.embed_tokens, ids), batch.input_ids, cfg.vocab_size)
        if batch.embeds_rows is not None:  # image tokens: their vision features replace the placeholder's embedding
            x = x.index_copy(0, batch.embeds_rows, batch.embeds.to(x.dtype))
        rope = None  # the fast path's attention computes its RoPE angles in-kernel
        if not fast.enabled(x):
            rope = rope_cos_sin(batch.positions, cfg.rotary_dim, cfg.rope_theta, cfg.mrope_section,
                                cfg.mrope_interleaved)
        for layer in self.layers:
            x = layer(x, batch, cache, rope)
        return x

    def compute_logits(self, hidden: torch.Tensor, decode: bool = True) -> torch.Tensor:
        return self._head(hidden)[0]

    def _head(self, hidden: torch.Tensor, decode: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(fp32 logits [N, V], the final norm's output [N, H] they were made from)."""
        # every row's logits through the decode GEMV path, prefill or not: one set of bits whether a row's forward
        # was a prefill, a decode step or a mix (the prefill matmul read the 0.27 GiB lm_head at ~0.5 TB/s: 536 us
        # for one row on the H200 against the GEMV's 84, lab/NOTES.md)
        h, prep = fast.norm_for_gemv(self.norm, hidden, self.lm_head, True)  # + the lm_head GEMV's prep
        return self._lm_head(h, prep), h

    def _lm_head(self, h: torch.Tensor, prep: fast.GemvPrep | None = None) -> torch.Tensor:
        decode = True  # the decode GEMV family for every row (compute_logits)
        if self.lm_head is not None:  # fp32 straight from the tensor-core GEMV (its bf16 results widened)
            logits = fast.linear(self.lm_head, h, decode, fp32_out=True, prep=prep)
        elif fast.enabled(h):  # the tied table read as a [V, H] matrix by the fast matmul
            logits = fast.linear(self.embed_tokens, h, decode)
        else:
            logits = self.embed_tokens.as_linear(h)
        return self.parallel.gather_vocab(logits).float()

    def forward(self, batch: ForwardBatch, cache: HybridCache) -> torch.Tensor:
        return self.forward_with_hidden(batch, cache)[0]

    def forward_with_hidden(self, batch: ForwardBatch, cache: HybridCache) -> tuple[torch.Tensor, torch.Tensor]:
        """(forward's logits [N, V], the hidden states [N, H] of the same rows AFTER the final norm: the h_i the MTP
        head drafts from, spec 3.9). The logits are forward's, bit for bit."""
        if batch.verify and not fast.enabled(self.norm.weight):
            _, logits, normed = self._verify_reference(batch, cache, head=True)
            return logits[batch.logits_indices], normed[batch.logits_indices]
        hidden = self.hidden_states(batch, cache)
        picked = hidden if batch.logits_all_rows else hidden[batch.logits_indices]  # the identity: no gather
        return self._head(picked)

    def _verify_reference(self, batch: ForwardBatch, cache: HybridCache, head: bool = False):
        """A verification (batch.verify) on the reference path, as what it promises: decode steps, step i taking
        token i of every sequence that has one. (hidden states [T, H], and with head each step's logits [T, V] and
        final-norm output [T, H], else None twice), rows in the batch's order; for sequences of several rows the
        DeltaNet states after each row are kept in the cache for commit_verified."""
        starts = batch.cu_seqlens_cpu.tolist()
        hidden, logits, normed = [None] * batch.num_tokens, [None] * batch.num_tokens, [None] * batch.num_tokens
        states: dict[int, list] = {}  # sequence -> [(conv, ssm) of every DeltaNet layer after row i, ...]
        for i in range(batch.max_seqlen):
            seqs = [b for b, n in enumerate(batch.seq_lens_cpu) if n > i]
            rows = torch.tensor([starts[b] + i for b in seqs], device=batch.input_ids.device)
            pick = torch.tensor(seqs, device=batch.input_ids.device)
            step = ForwardBatch(
                input_ids=batch.input_ids[rows], positions=batch.positions[..., rows],
                cu_seqlens=torch.arange(len(seqs) + 1, device=rows.device), context_lens=batch.context_lens[pick] + i,
                block_tables=batch.block_tables[pick], slot_mapping=batch.slot_mapping[rows],
                state_slots=batch.state_slots[pick], logits_indices=torch.arange(len(seqs), device=rows.device),
                seq_lens_cpu=[1] * len(seqs), context_lens_cpu=[batch.context_lens_cpu[b] + i for b in seqs],
                block_size=batch.block_size, logits_all_rows=True,
            )
            h = self.hidden_states(step, cache)
            made = self._head(h) if head else (h, h)  # per step, as the decode steps make them
            for j, row in enumerate(rows.tolist()):
                hidden[row], logits[row], normed[row] = h[j], made[0][j], made[1][j]
            for b in seqs:
                if batch.seq_lens_cpu[b] > 1:
                    slot = int(batch.state_slots[b])
                    states.setdefault(b, []).append({l: (cache.conv[l][slot].clone(), cache.ssm[l][slot].clone())
                                                     for l in cache.conv})
        cache.verify_inputs[-1] = states  # the reference path's record: one entry for every layer
        if not head:
            return torch.stack(hidden), None, None
        return torch.stack(hidden), torch.stack(logits), torch.stack(normed)

    def commit_verified(self, batch: ForwardBatch, cache: HybridCache, keep: torch.Tensor) -> None:
        """After a verification forward (batch.verify): set each sequence's DeltaNet conv windows and states to those
        after its first keep[b] rows (a device tensor [B], >= 1: the token verified first is always kept; it is
        clipped to the sequence's rows). Every sequence of the batch needs its entry, one-row ones included."""
        if not batch.verify:
            raise ValueError("commit_verified: the batch is not a verification (ForwardBatch.verify)")
        if keep.numel() != batch.num_seqs:
            raise ValueError(f"commit_verified: keep has {keep.numel()} entries for {batch.num_seqs} sequences")
        states = cache.verify_inputs.pop(-1, None)
        if states is not None:  # the reference path: the states after row keep - 1
            for b, per_row in states.items():
                k = min(int(keep[b]), len(per_row))
                if k < 1:
                    raise ValueError(f"commit_verified: keep[{b}] is {int(keep[b])}; the first row is always kept")
                slot = int(batch.state_slots[b])
                for layer, (conv, ssm) in per_row[k - 1].items():
                    cache.conv[layer][slot].copy_(conv)
                    cache.ssm[layer][slot].copy_(ssm)
            return
        for layer in self.layers:
            if not layer.is_attention:
                layer.linear_attn.commit_verify(batch, cache, keep)

    def draft(self, batch: ForwardBatch, cache: HybridCache, hidden: torch.Tensor, step: int = 0
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """One MTP step (model/mtp.py) over batch's rows: batch.input_ids the next tokens t_{i+1}, batch.positions
        the positions i (their MTP KV slots), hidden [T, H] the h_i (forward_with_hidden's) or the previous step's
        y. The cache must hold the MTP KV (make_cache(mtp=True)). Returns (draft logits fp32 [N, V] of the rows
        batch.logits_indices selects, y [T, H] of every row, the next step's hidden)."""
        if self.mtp is None:
            raise RuntimeError("draft: this model has no MTP head (the checkpoint lacks one, or it was loaded with "
                               "mtp=False), so speculative decoding with the model's own draft head is unavailable")
        cfg = self.config
        if mtp_cache_layer(cfg, step % self.mtp.num_layers) not in cache.k:
            raise ValueError("draft: the cache holds no KV for the MTP head; make it with make_cache(mtp=True)")
        embedded = fast.embed(self.embed_tokens, batch.input_ids)
        rope = None
        if not fast.enabled(embedded):
            rope = rope_cos_sin(batch.positions, cfg.rotary_dim, cfg.rope_theta, cfg.mrope_section,
                                cfg.mrope_interleaved)
        y = self.mtp(embedded, hidden, batch, cache, rope, step)
        picked = y if batch.logits_all_rows else y[batch.logits_indices]
        return self._lm_head(picked), y

"""The multi-token-prediction (MTP) head every Qwen3.5 / 3.6 checkpoint ships (spec 2.3 and 3.9): the model's own
draft model for speculative decoding.

For a row with the target's hidden state h_i (AFTER the final norm: the vector lm_head reads) and the next token
t_{i+1}, at position i:

  x = fc([pre_fc_norm_embedding(Embed[t_{i+1}]) ; pre_fc_norm_hidden(h_i)])      embedding FIRST, hidden second
  x = one full-attention decoder layer (gated attention, q/k norms, partial (M)RoPE at position i, then the MoE
      block or dense MLP of the model), with its own paged KV cache
  y = mtp.norm(x);   draft logits = lm_head(y)  (the shared lm_head, or the tied embedding), predicting t_{i+2}

A second draft reuses the layer (layer index = step % num_layers) with hidden := y and the drafted token, at
position i + 1. Parameter names are the published ones (`mtp.fc.weight`, `mtp.layers.0.self_attn.q_proj.weight`,
`mtp.norm.weight`, ...). There is no MTP embedding or lm_head: the caller passes the main model's.

Its KV cache: MTP layer j's K/V live in the HybridCache as one more full-attention layer, cache index
num_hidden_layers + j (HybridCache(mtp_layers=)), in the same block pool and under the same block tables as the
main layers: the MTP's entry for position i sits in the slot the main layers use for position i. So a sequence's
drafts need no blocks of their own, and the engine frees or reuses a rejected position's slot for both at once.
"""

from __future__ import annotations

import torch
from torch import nn

from . import fast
from .cache import HybridCache
from .config import ModelConfig
from .decoder_layer import DecoderLayer
from .forward_batch import ForwardBatch
from .layers import WeightFactory
from .norm import RMSNorm

PREFIX = "mtp"


def mtp_cache_layer(config: ModelConfig, j: int) -> int:
    """The HybridCache index of MTP layer j's KV (after the main layers, as llama.cpp numbers its blk.{L})."""
    return config.num_hidden_layers + j


class MTPHead(nn.Module):
    """forward(embedded, hidden, batch, cache, rope, step) -> y [T, H] (after mtp.norm; lm_head(y) = draft logits)."""

    def __init__(self, config: ModelConfig, weights: WeightFactory, norm_offset: float, num_layers: int):

        super().__init__()
        if num_layers < 1:
            raise ValueError(f"MTPHead: num_layers must be >= 1, found {num_layers}")
        h, eps = config.hidden_size, config.rms_norm_eps
        self.num_layers = num_layers
        self.pre_fc_norm_embedding = RMSNorm(h, eps, norm_offset)
        self.pre_fc_norm_hidden = RMSNorm(h, eps, norm_offset)
        self.fc = weights.linear(f"{PREFIX}.fc", 2 * h, h)  # [H, 2H]: input [embedding ; hidden]
        self.layers = nn.ModuleList(
            DecoderLayer(mtp_cache_layer(config, j), config, weights, norm_offset, prefix=f"{PREFIX}.layers.{j}",
                         attention=True, sparse=config.is_moe)
            for j in range(num_layers)
        )
        self.norm = RMSNorm(h, eps, norm_offset)

    def forward(self, embedded: torch.Tensor, hidden: torch.Tensor, batch: ForwardBatch, cache: HybridCache,
                rope, step: int = 0) -> torch.Tensor:
        """embedded [T, H]: Embed[t_{i+1}] of each row's next token (batch.input_ids); hidden [T, H]: h_i (the target's
        final-norm output, or the previous draft step's y); batch: the rows at positions i (their KV slots);
        rope: the reference path's (cos, sin) of batch.positions, None on the fast path. Returns y [T, H]."""
        if embedded.shape != hidden.shape or embedded.shape[0] != batch.num_tokens:
            raise ValueError(f"MTPHead: embedded {tuple(embedded.shape)} and hidden {tuple(hidden.shape)} must both be "
                             f"[{batch.num_tokens}, H] (one row per token of the batch)")
        decode = batch.decode_rows
        x = torch.cat([self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden)], dim=-1)
        x = fast.linear(self.fc, x, decode)
        x = self.layers[step % self.num_layers](x, batch, cache, rope)
        return self.norm(x)

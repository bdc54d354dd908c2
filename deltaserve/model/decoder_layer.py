"""One decoder layer of the Qwen3.5 / 3.6 family: a token mixer (gated attention or Gated DeltaNet) and a
feed-forward block (MoE or dense MLP), each behind a zero-centred RMSNorm with a residual. The model
(model/qwen3_5.py) stacks them; the MTP head (model/mtp.py) runs one more."""

from __future__ import annotations

import torch
from torch import nn

from . import fast, fusion
from .attention import GatedAttention
from .cache import HybridCache
from .config import ModelConfig
from .forward_batch import ForwardBatch
from .gated_deltanet import GatedDeltaNet
from .layers import WeightFactory
from .mlp import MLP, SparseMoeBlock
from .norm import RMSNorm
from .parallel import SINGLE, Parallel


class DecoderLayer(nn.Module):
    """layer: the cache index of its state (KV or DeltaNet slots); prefix, attention, sparse: its parameter path and
    kind when they are not those of main layer `layer` (the MTP head's layers, model/mtp.py). parallel: tensor
    parallelism, under which the mixer's and the feed-forward's outputs are partial sums (model/parallel.py)."""

    def __init__(self, layer: int, config: ModelConfig, weights: WeightFactory, norm_offset: float,
                 prefix: str | None = None, attention: bool | None = None, sparse: bool | None = None,
                 parallel: Parallel = SINGLE):
        super().__init__()
        self.parallel = parallel
        p = prefix or f"layers.{layer}"
        eps = config.rms_norm_eps
        self.is_attention = config.is_full_attention(layer) if attention is None else attention
        self.input_layernorm = RMSNorm(config.hidden_size, eps, norm_offset)
        if self.is_attention:
            self.self_attn = GatedAttention(f"{p}.self_attn", layer, config, weights, norm_offset)
        else:
            self.linear_attn = GatedDeltaNet(f"{p}.linear_attn", layer, config, weights)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, norm_offset)
        if config.sparse_layers[layer] if sparse is None else sparse:
            self.mlp = SparseMoeBlock(f"{p}.mlp", config, weights, parallel)
        else:
            self.mlp = MLP(f"{p}.mlp", config.hidden_size, config.intermediate_size, weights)

    def forward(self, x, batch: ForwardBatch, cache: HybridCache, rope) -> torch.Tensor:
        if fast.enabled(x):
            return self._forward_fast(x, batch, cache, rope)
        h = self.input_layernorm(x)
        if self.is_attention:
            h = self.self_attn(h, batch, cache, rope)
        else:
            h = self.linear_attn(h, batch, cache)
        x = x + self.parallel.reduce(h)
        return x + self.parallel.reduce(self.mlp(self.post_attention_layernorm(x), decode=batch.decode_rows))

    def _forward_fast(self, x, batch: ForwardBatch, cache: HybridCache, rope) -> torch.Tensor:
        """Same math, fewer launches: add_rms_norm writes x + h and its post-attention norm in one kernel, and the
        feed-forward block adds the residual itself (the MoE decode kernels inside their combine launch)."""
        from ..kernels.triton_norm import add_rms_norm

        decode = batch.decode_rows
        mixer, group = (self.self_attn, "qkv_proj") if self.is_attention else (self.linear_attn, "in_proj")
        h, prep = fast.norm_for_gemv(self.input_layernorm, x, fusion.fused(mixer, group), decode)  # + the GEMV's prep
        if self.is_attention:
            h = self.self_attn(h, batch, cache, rope, prep=prep)
        else:
            h = self.linear_attn(h, batch, cache, prep=prep)
        tp = self.parallel.size > 1
        h = self.parallel.reduce(h)  # tensor parallelism: the ranks' partial sums, before the residual joins
        post = self.post_attention_layernorm
        prep = fast.moe_prep(self.mlp, h)  # the tensor-core MoE reads x's group sums: the norm makes them
        if not tp and prep is not None and self.mlp.routes_normed(h, decode):
            return self.mlp(h, decode=decode, residual=x, norm=post)  # the norm inside the router's launch
        sums = {}  # xs=: x's group sums, made by the norm for the tensor-core MoE (moe_prep: MoE blocks only)
        if prep is None:
            h, x = add_rms_norm(h, x, post.weight, post.eps, post.offset)  # (norm(x + h), x + h), both [T, H]
        else:
            h, x, made = add_rms_norm(h, x, post.weight, post.eps, post.offset, prep=prep, sums_only=True)
            sums = {"xs": made[1]}
        if tp:  # the residual is added once, after the sum over ranks: not inside the feed-forward's last launch
            return x + self.parallel.reduce(self.mlp(h, decode=decode, **sums))
        return self.mlp(h, decode=decode, residual=x, **sums)

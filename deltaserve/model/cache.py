"""Cache storage owned by the model: paged KV for full-attention layers, state slots for DeltaNet layers.

The engine decides which blocks and slots a sequence owns (block tables, slot indices in the ForwardBatch); this
module only says what the storage looks like and allocates it.

  k[l], v[l]   [num_blocks, block_size, Hkv, head_dim]   activation dtype, one pair per full-attention layer
  conv[l]      [num_slots, conv_dim, K-1]                activation dtype, last K-1 pre-conv qkv vectors
  ssm[l]       [num_slots, Hv, dk, dv]                   float32 recurrent state (S, read as o = S^T q)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import ModelConfig


@dataclass
class CacheSpec:
    """Sizes the engine needs to budget memory."""

    block_size: int
    bytes_per_block: int  # all full-attention layers, K and V
    bytes_per_state_slot: int  # all DeltaNet layers, conv + recurrent


def cache_spec(config: ModelConfig, block_size: int, dtype: torch.dtype) -> CacheSpec:
    elt = torch.tensor([], dtype=dtype).element_size()
    n_attn = len(config.full_attention_layers)
    n_gdn = len(config.linear_attention_layers)
    kv = n_attn * 2 * block_size * config.num_key_value_heads * config.head_dim * elt
    conv = config.conv_dim * (config.linear_conv_kernel_dim - 1) * elt
    ssm = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * 4
    return CacheSpec(block_size, kv, n_gdn * (conv + ssm))


class HybridCache:
    """Per-layer cache tensors, indexed by the model's layer number."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        num_state_slots: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_state_slots = num_state_slots
        self.dtype = dtype
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.conv: dict[int, torch.Tensor] = {}
        self.ssm: dict[int, torch.Tensor] = {}
        hkv, d = config.num_key_value_heads, config.head_dim
        for layer in config.full_attention_layers:
            self.k[layer] = torch.zeros(num_blocks, block_size, hkv, d, dtype=dtype, device=device)
            self.v[layer] = torch.zeros(num_blocks, block_size, hkv, d, dtype=dtype, device=device)
        km1 = config.linear_conv_kernel_dim - 1
        hv, dk, dv = config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim
        for layer in config.linear_attention_layers:
            self.conv[layer] = torch.zeros(num_state_slots, config.conv_dim, km1, dtype=dtype, device=device)
            self.ssm[layer] = torch.zeros(num_state_slots, hv, dk, dv, dtype=torch.float32, device=device)

    def copy_state_slot(self, src: int, dst: int) -> None:
        """Copy one sequence's DeltaNet state (used by prefix caching and forking)."""
        for layer in self.conv:
            self.conv[layer][dst].copy_(self.conv[layer][src])
            self.ssm[layer][dst].copy_(self.ssm[layer][src])

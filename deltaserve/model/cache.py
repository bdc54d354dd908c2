"""Cache storage owned by the model: paged KV for full-attention layers, state slots for DeltaNet layers.

The engine decides which blocks and slots a sequence owns (block tables, slot indices in the ForwardBatch); this
module only says what the storage looks like and allocates it.

  k[l], v[l]   [num_blocks, block_size, Hkv, head_dim]   kv dtype (default: the activation dtype), per full-attention
                                                          layer; fp8 e4m3 (kernels/attention/kv_fp8.py) adds
  k_scale[l], v_scale[l]  [num_blocks, block_size, Hkv]  float32, one scale per cached row
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


KV_CACHE_DTYPES = ("auto", "fp8")  # auto: the activation dtype; fp8: e4m3 with a scale per (token, KV head) row


def parse_kv_cache_dtype(name: str | None) -> torch.dtype | None:
    """'auto' / None -> None (the activation dtype), 'fp8' (or 'fp8_e4m3') -> torch.float8_e4m3fn."""
    from ..kernels.attention.kv_fp8 import FP8

    key = (name or "auto").lower()
    if key == "auto":
        return None
    if key in ("fp8", "fp8_e4m3"):
        return FP8
    raise ValueError(f"kv_cache_dtype {name!r} is not supported; use one of {', '.join(KV_CACHE_DTYPES)}")


def cache_spec(config: ModelConfig, block_size: int, dtype: torch.dtype, kv_dtype: torch.dtype | None = None
               ) -> CacheSpec:
    from ..kernels.attention.kv_fp8 import FP8

    elt = torch.tensor([], dtype=dtype).element_size()
    n_attn = len(config.full_attention_layers)
    n_gdn = len(config.linear_attention_layers)
    row = config.head_dim + 4 if kv_dtype == FP8 else config.head_dim * elt  # fp8: D bytes and an fp32 scale
    kv = n_attn * 2 * block_size * config.num_key_value_heads * row
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
        kv_dtype: torch.dtype | None = None,
    ):
        from ..kernels.attention.kv_fp8 import FP8

        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_state_slots = num_state_slots
        self.dtype = dtype
        self.kv_dtype = kv_dtype or dtype
        if self.kv_dtype not in (dtype, FP8):
            raise ValueError(f"HybridCache: kv_dtype {self.kv_dtype} must be the activation dtype {dtype} or {FP8}")
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.k_scale: dict[int, torch.Tensor] = {}  # fp8 only: one fp32 scale per cached (token, KV head) row
        self.v_scale: dict[int, torch.Tensor] = {}
        self.conv: dict[int, torch.Tensor] = {}
        self.ssm: dict[int, torch.Tensor] = {}
        hkv, d = config.num_key_value_heads, config.head_dim
        for layer in config.full_attention_layers:
            self.k[layer] = torch.zeros(num_blocks, block_size, hkv, d, dtype=self.kv_dtype, device=device)
            self.v[layer] = torch.zeros(num_blocks, block_size, hkv, d, dtype=self.kv_dtype, device=device)
            if self.kv_dtype == FP8:
                self.k_scale[layer] = torch.ones(num_blocks, block_size, hkv, dtype=torch.float32, device=device)
                self.v_scale[layer] = torch.ones(num_blocks, block_size, hkv, dtype=torch.float32, device=device)
        km1 = config.linear_conv_kernel_dim - 1
        hv, dk, dv = config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim
        for layer in config.linear_attention_layers:
            self.conv[layer] = torch.zeros(num_state_slots, config.conv_dim, km1, dtype=dtype, device=device)
            self.ssm[layer] = torch.zeros(num_state_slots, hv, dk, dv, dtype=torch.float32, device=device)

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(k, v, k_scale, v_scale) of a full-attention layer; the scales are None unless the cache is fp8."""
        return self.k[layer], self.v[layer], self.k_scale.get(layer), self.v_scale.get(layer)

    def copy_state_slot(self, src: int, dst: int) -> None:
        """Copy one sequence's DeltaNet state (used by prefix caching and forking)."""
        for layer in self.conv:
            self.conv[layer][dst].copy_(self.conv[layer][src])
            self.ssm[layer][dst].copy_(self.ssm[layer][src])

"""Cache storage owned by the model: paged KV for full-attention layers, state slots for DeltaNet layers.

The engine decides which blocks and slots a sequence owns (block tables, slot indices in the ForwardBatch); this
module only says what the storage looks like and allocates it.

  k[l], v[l]   [num_blocks, block_size, Hkv, head_dim]   kv dtype (default: the activation dtype), per full-attention
                                                          layer (with mtp_layers: also l = L .. L + mtp_layers - 1,
                                                          the MTP head's, L = num_hidden_layers; model/mtp.py);
                                                          fp8 e4m3 (kernels/attention/kv_fp8.py) adds
  k_scale[l], v_scale[l]  [num_blocks, block_size, Hkv]  float32, one scale per cached row
  conv[l]      [num_slots, conv_dim, K-1]                activation dtype, last K-1 pre-conv qkv vectors
  ssm[l]       [num_slots, Hv, dk, dv]                   float32 recurrent state (S, read as o = S^T q)
  snap_conv[l], snap_ssm[l]  [num_snapshots, ...]        copies of a slot's conv + recurrent state at a prompt seam
                                                          (the prefix cache: a later request resumes from one)
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
    bytes_per_state_slot: int  # all DeltaNet layers, conv + recurrent (a prefix-cache snapshot is the same size)


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


def cache_spec(config: ModelConfig, block_size: int, dtype: torch.dtype, kv_dtype: torch.dtype | None = None,
               mtp_layers: int = 0) -> CacheSpec:
    """mtp_layers: the MTP head's attention layers share the blocks (HybridCache(mtp_layers=))."""
    from ..kernels.attention.kv_fp8 import FP8

    elt = torch.tensor([], dtype=dtype).element_size()
    n_attn = len(config.full_attention_layers) + mtp_layers
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
        num_snapshots: int = 0,
        mtp_layers: int = 0,
    ):
        from ..kernels.attention.kv_fp8 import FP8

        self.block_size = block_size
        self.num_snapshots = num_snapshots
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
        # The last verification forward's (ForwardBatch.verify) per-DeltaNet-layer record, until
        # Qwen3_5ForCausalLM.commit_verified consumes it: the fast path's inputs to replay, or the reference path's
        # states after each row of each sequence.
        self.verify_inputs: dict[int, tuple] = {}
        hkv, d = config.num_key_value_heads, config.head_dim
        mtp = range(config.num_hidden_layers, config.num_hidden_layers + mtp_layers)  # model/mtp.mtp_cache_layer
        for layer in [*config.full_attention_layers, *mtp]:
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
        self.snap_conv = {l: torch.zeros(num_snapshots, *t.shape[1:], dtype=t.dtype, device=device)
                          for l, t in self.conv.items()} if num_snapshots else {}
        self.snap_ssm = {l: torch.zeros(num_snapshots, *t.shape[1:], dtype=t.dtype, device=device)
                         for l, t in self.ssm.items()} if num_snapshots else {}

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(k, v, k_scale, v_scale) of a full-attention layer; the scales are None unless the cache is fp8."""
        return self.k[layer], self.v[layer], self.k_scale.get(layer), self.v_scale.get(layer)

    def copy_state_slot(self, src: int, dst: int) -> None:
        """Copy one sequence's DeltaNet state (forking)."""
        for layer in self.conv:
            self.conv[layer][dst].copy_(self.conv[layer][src])
            self.ssm[layer][dst].copy_(self.ssm[layer][src])

    def save_state(self, slot: int, snapshot: int) -> None:
        """Snapshot `snapshot` <- state slot `slot` (every DeltaNet layer's conv window and recurrent state),
        asynchronously on the current stream."""
        dst = [t[snapshot] for t in (*self.snap_conv.values(), *self.snap_ssm.values())]
        src = [t[slot] for t in (*self.conv.values(), *self.ssm.values())]
        if dst:
            torch._foreach_copy_(dst, src)

    def load_state(self, snapshot: int, slot: int) -> None:
        """State slot `slot` <- snapshot `snapshot`, asynchronously on the current stream."""
        dst = [t[slot] for t in (*self.conv.values(), *self.ssm.values())]
        src = [t[snapshot] for t in (*self.snap_conv.values(), *self.snap_ssm.values())]
        if dst:
            torch._foreach_copy_(dst, src)

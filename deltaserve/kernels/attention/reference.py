"""Attention over the paged KV cache, reference path.

  k_cache, v_cache [num_blocks, block_size, Hkv, D]
  block_tables     [B, max_blocks] int32
  q                [T, Hq, D]  the new tokens of all sequences (cu_seqlens order)
New token i of sequence b sits at cache index ctx_b + i and attends causally to cache indices 0..ctx_b + i.
Query head h uses KV head h // (Hq / Hkv). Softmax in fp32.
An fp8 cache (kv_fp8.py) comes with k_scale, v_scale [num_blocks, block_size, Hkv]: rows are written by
kv_fp8.quantize_rows and read as x8 * scale.
"""

from __future__ import annotations

import torch

from .kv_fp8 import check_cache, dequantize_rows, is_fp8, quantize_rows


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:
    """Store K/V of the new tokens ([T, Hkv, D]) at their flat slots (block * block_size + offset); an fp8 cache
    quantises each (token, head) row with its own scale."""
    nb, bs, hkv, d = k_cache.shape
    fp8 = check_cache(k_cache, v_cache, k_scale, v_scale, "write_kv")
    for cache, scales, x in ((k_cache, k_scale, k), (v_cache, v_scale, v)):
        if fp8:
            x8, sc = quantize_rows(x)
            cache.view(nb * bs, hkv, d)[slot_mapping] = x8
            scales.view(nb * bs, hkv)[slot_mapping] = sc
        else:
            cache.view(nb * bs, hkv, d)[slot_mapping] = x.to(cache.dtype)


def gather_kv(cache: torch.Tensor, table: torch.Tensor, length: int, scales: torch.Tensor | None = None
              ) -> torch.Tensor:
    """The first `length` cached entries of one sequence, [length, Hkv, D] (an fp8 cache's dequantised, fp32)."""
    nb, bs, hkv, d = cache.shape
    idx = torch.arange(length, device=cache.device)
    slots = table.to(torch.long)[idx // bs] * bs + idx % bs
    rows = cache.view(nb * bs, hkv, d)[slots]
    if is_fp8(cache):
        return dequantize_rows(rows, scales.view(nb * bs, hkv)[slots])
    return rows


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: list[int],
    seq_lens: list[int],
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of the new tokens over their sequence's cache (which already holds the new K/V)."""
    check_cache(k_cache, v_cache, k_scale, v_scale, "paged_attention")
    hq = q.shape[1]
    hkv = k_cache.shape[2]
    rep = hq // hkv
    out = torch.empty_like(q)
    start = 0
    for b, (ctx, n) in enumerate(zip(context_lens, seq_lens)):
        total = ctx + n
        kk = gather_kv(k_cache, block_tables[b], total, k_scale).float().repeat_interleave(rep, dim=1)  # [S, Hq, D]
        vv = gather_kv(v_cache, block_tables[b], total, v_scale).float().repeat_interleave(rep, dim=1)
        qq = q[start : start + n].float()  # [n, Hq, D]
        scores = torch.einsum("nhd,shd->hns", qq, kk) * scale
        q_idx = torch.arange(ctx, total, device=q.device)[:, None]
        k_idx = torch.arange(total, device=q.device)[None, :]
        scores = scores.masked_fill(k_idx > q_idx, float("-inf"))
        probs = scores.softmax(dim=-1)
        out[start : start + n] = torch.einsum("hns,shd->nhd", probs, vv).to(q.dtype)
        start += n
    return out

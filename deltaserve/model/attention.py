"""Gated full attention (every fourth layer): q|gate per head, q/k norms, partial RoPE, GQA, sigmoid gate."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.attention import paged_attention, write_kv
from ..kernels.rope import apply_rope, rope_inv_freq
from . import fast, fusion
from .cache import HybridCache
from .config import ModelConfig
from .forward_batch import ForwardBatch
from .layers import WeightFactory
from .norm import RMSNorm


class GatedAttention(nn.Module):
    # fusion.fuse_projections: one [Hq*D*(1+gated) + 2*Hkv*D, H] weight, rows in this order
    FUSED_PROJECTIONS = ("qkv_proj", ("q_proj", "k_proj", "v_proj"))

    def __init__(self, prefix: str, layer: int, config: ModelConfig, weights: WeightFactory, norm_offset: float):
        super().__init__()
        self.layer = layer
        self.hq, self.hkv, self.d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.gated = config.attn_output_gate
        h = config.hidden_size
        q_out = self.hq * self.d * (2 if self.gated else 1)
        self.q_proj = weights.linear(f"{prefix}.q_proj", h, q_out)
        self.k_proj = weights.linear(f"{prefix}.k_proj", h, self.hkv * self.d)
        self.v_proj = weights.linear(f"{prefix}.v_proj", h, self.hkv * self.d)
        self.o_proj = weights.linear(f"{prefix}.o_proj", self.hq * self.d, h)
        self.q_norm = RMSNorm(self.d, config.rms_norm_eps, norm_offset)
        self.k_norm = RMSNorm(self.d, config.rms_norm_eps, norm_offset)
        self.scale = self.d**-0.5
        self.rotary_dim, self.rope_theta = config.rotary_dim, config.rope_theta
        self.mrope_section, self.mrope_interleaved = config.mrope_section, config.mrope_interleaved
        self._inv_freq_cache: torch.Tensor | None = None  # _inv_freq's (a plain attribute: no state_dict entry)

    def forward(
        self, x: torch.Tensor, batch: ForwardBatch, cache: HybridCache, rope: tuple[torch.Tensor, torch.Tensor] | None,
        prep: fast.GemvPrep | None = None,
    ) -> torch.Tensor:
        """rope: rope_cos_sin's (cos, sin) for the reference path; the fast path computes its angles in-kernel.
        prep: x's prep for the projection's decode GEMV, made by the norm that wrote x (fast.norm_for_gemv)."""
        if fast.enabled(x):
            return self._forward_fast(x, batch, cache, prep)
        t = x.shape[0]
        decode = batch.decode_rows
        qg, k, v = self._project(x, decode)
        if self.gated:
            qg = qg.view(t, self.hq, 2 * self.d)
            q, gate = qg[..., : self.d], qg[..., self.d :].reshape(t, self.hq * self.d)
        else:
            q, gate = qg.view(t, self.hq, self.d), None
        k, v = k.view(t, self.hkv, self.d), v.view(t, self.hkv, self.d)
        q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k_cache, v_cache, k_scale, v_scale = cache.kv(self.layer)
        write_kv(k_cache, v_cache, batch.slot_mapping, k, v, k_scale, v_scale)
        o = paged_attention(
            q, k_cache, v_cache, batch.block_tables, batch.context_lens_cpu, batch.seq_lens_cpu, self.scale,
            k_scale, v_scale,
        )
        o = o.reshape(t, self.hq * self.d)
        if gate is not None:
            o = o * torch.sigmoid(gate)
        return fast.linear(self.o_proj, o, decode)

    def _project(self, x: torch.Tensor, decode: bool, prep: fast.GemvPrep | None = None):
        """(q|gate [T, Hq*D*(1+gated)], k, v [T, Hkv*D]): one launch on the fused weight on the fast path (column
        views of one output; write_kv and the norms take row strides), else one per projection."""
        proj = fusion.fused(self, "qkv_proj") if fast.enabled(x) else None
        if proj is not None:
            return fast.linear(proj, x, decode, prep=prep).split(proj.sizes, dim=-1)
        return tuple(fast.linear(m, x, decode, prep=prep) for m in (self.q_proj, self.k_proj, self.v_proj))

    def _inv_freq(self, device) -> torch.Tensor:
        """RoPE inverse frequencies [rotary_dim / 2] fp32, made once per device (the first, eager step: never
        inside a CUDA-graph capture)."""
        inv = self._inv_freq_cache
        if inv is None or inv.device != device:
            inv = self._inv_freq_cache = rope_inv_freq(self.rotary_dim, self.rope_theta, device)
        return inv

    def _project_and_write(self, x: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                           cache: HybridCache, decode: bool, prep: fast.GemvPrep | None = None):
        """The fused projection of x's tokens, then one kernel for q/k norms + RoPE + the K/V append at slot_mapping:
        (q [T, Hq, D], the gate's view of the projection or None, the layer's (k_cache, v_cache, k_scale, v_scale))."""
        from ..kernels.attention.triton_qk_prep import qk_norm_rope_write

        t, d = x.shape[0], self.d
        qg, k, v = self._project(x, decode, prep)
        qg = qg.view(t, self.hq, (2 if self.gated else 1) * d)
        kv = cache.kv(self.layer)
        k_cache, v_cache, k_scale, v_scale = kv
        q = qk_norm_rope_write(
            qg[..., :d], k.view(t, self.hkv, d), v.view(t, self.hkv, d), self.q_norm.weight, self.k_norm.weight,
            self.q_norm.eps, self.q_norm.offset, positions, self._inv_freq(x.device), k_cache, v_cache,
            slot_mapping, self.mrope_section, self.mrope_interleaved, k_scale=k_scale, v_scale=v_scale,
        )
        return q, qg[..., d:] if self.gated else None, kv

    def decode_rows(self, x: torch.Tensor, batch: ForwardBatch, cache: HybridCache, lo: int, hi: int,
                    out: torch.Tensor | None = None, prep: fast.GemvPrep | None = None) -> torch.Tensor:
        """Rows lo .. hi-1 of a decode step of one token a sequence (x: those rows; fast.mixer_decode): the fused
        projection, one kernel for q/k norms + RoPE + KV append, decode attention with the sigmoid gate in its
        epilogue, o_proj (into out when given). A verification's rows (batch.verify) are decode rows too, each with
        its own length and its sequence's table."""
        from ..kernels.attention import triton_paged as tp

        t, d = x.shape[0], self.d
        q, gate, (k_cache, v_cache, k_scale, v_scale) = self._project_and_write(
            x, batch.positions[..., lo:hi], batch.slot_mapping[lo:hi], cache, True, prep)
        tables, lens = (batch.row_block_tables, batch.row_context_lens) if batch.verify else (batch.block_tables,
                                                                                             batch.context_lens)
        block_tables = tables[lo:hi]
        max_kv = block_tables.shape[1] * batch.block_size
        fmt = fast.attn_merge_prep(self.o_proj, x, self.hq, d)  # the out projection's prep, made by the merge
        o = tp.paged_decode_attention(
            q, k_cache, v_cache, block_tables, lens[lo:hi], self.scale, max_kv, gate=gate, lens_add=1,
            k_scale=k_scale, v_scale=v_scale, merge=tp.merge_shape(throughput=fast.throughput_deployment(self)),
            # earlier forwards wrote every position but the new token's (each starts without PDL); not so for a
            # verification's rows, which read the K/V of the rows before them, written by this forward
            settled=not batch.verify,
            prep=fmt,
        )
        if fmt is not None:
            o, made = o
            return fast.linear(self.o_proj, o.view(t, self.hq * d), True, out=out, prep=fast.GemvPrep(fmt, made))
        return fast.linear(self.o_proj, o.view(t, self.hq * d), True, out=out)

    def _forward_fast(self, x: torch.Tensor, batch: ForwardBatch, cache: HybridCache,
                      prep: fast.GemvPrep | None = None) -> torch.Tensor:
        """Decode: fused projection, one kernel for q/k norms + RoPE + KV append, decode attention with the sigmoid
        gate in its epilogue, o_proj (3 launches between the projections). Prefill: the same prep kernel, varlen
        attention with the gate in its epilogue too (the gate read in place: no copy, sigmoid or product by torch)."""
        from ..kernels.attention import triton_paged as tp

        t, d = x.shape[0], self.d
        decode = batch.decode_rows
        if batch.verify:  # rows read the K/V the rows before them write: one launch of each (no halves on streams)
            return self.decode_rows(x, batch, cache, 0, t, prep=prep)
        if decode and batch.num_tokens == batch.num_seqs:  # one token per sequence
            return fast.mixer_decode(self, "attention", x, batch, cache, prep)  # all rows, or two halves
        q, gate, (k_cache, v_cache, k_scale, v_scale) = self._project_and_write(
            x, batch.positions, batch.slot_mapping, cache, decode, prep)
        o = tp.paged_prefill_attention(
            q, k_cache, v_cache, batch.block_tables, batch.cu_seqlens, batch.context_lens, self.scale, batch.max_seqlen,
            k_scale=k_scale, v_scale=v_scale, gate=gate,
        ).reshape(t, self.hq * d)
        return fast.linear(self.o_proj, o, decode)

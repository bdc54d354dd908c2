"""Gated DeltaNet mixer (linear_attention layers)."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.conv1d import causal_conv1d
from ..kernels.gated_delta import gated_delta_chunked, gated_delta_recurrent, gdn_gates, l2norm
from . import fast, fusion
from .cache import HybridCache
from .config import ModelConfig
from .forward_batch import ForwardBatch
from .layers import WeightFactory
from .norm import GatedRMSNorm

# Sequences with at least this many new tokens use the chunked form; shorter ones step token by token.
CHUNKED_MIN_TOKENS = 16


class GatedDeltaNet(nn.Module):
    # fusion.fuse_projections: one [conv_dim + value_dim + 2 Hv, H] weight, rows in this order
    FUSED_PROJECTIONS = ("in_proj", ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"))

    def __init__(self, prefix: str, layer: int, config: ModelConfig, weights: WeightFactory):
        super().__init__()
        self.layer = layer
        self.hk, self.hv = config.linear_num_key_heads, config.linear_num_value_heads
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim, self.value_dim = config.key_dim, config.value_dim
        h, c, kw = config.hidden_size, config.conv_dim, config.linear_conv_kernel_dim
        self.in_proj_qkv = weights.linear(f"{prefix}.in_proj_qkv", h, c)
        self.in_proj_z = weights.linear(f"{prefix}.in_proj_z", h, self.value_dim)
        self.in_proj_b = weights.linear(f"{prefix}.in_proj_b", h, self.hv)
        self.in_proj_a = weights.linear(f"{prefix}.in_proj_a", h, self.hv)
        self.conv1d = nn.Module()
        self.conv1d.weight = nn.Parameter(torch.empty(c, 1, kw), requires_grad=False)  # HF layout [C, 1, K]
        self.A_log = nn.Parameter(torch.empty(self.hv), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.empty(self.hv), requires_grad=False)
        self.norm = GatedRMSNorm(self.dv, config.rms_norm_eps)
        self.out_proj = weights.linear(f"{prefix}.out_proj", self.value_dim, h)
        self.scale = self.dk**-0.5
        self._conv_taps: torch.Tensor | None = None  # _conv_taps_major's copy (a plain attribute: no state_dict entry)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: HybridCache,
                prep: fast.GemvPrep | None = None) -> torch.Tensor:
        """prep: x's prep for the in-projection's decode GEMV, made by the norm that wrote x (fast.norm_for_gemv)."""
        if fast.enabled(x):
            return self._forward_fast(x, batch, cache, prep)
        t = x.shape[0]
        qkv = self.in_proj_qkv(x)  # [T, conv_dim]
        z = self.in_proj_z(x).view(t, self.hv, self.dv)
        g, beta = gdn_gates(self.in_proj_a(x), self.in_proj_b(x), self.A_log, self.dt_bias)  # [T, Hv] fp32
        conv_w = self.conv1d.weight[:, 0, :]
        conv_pool, ssm_pool = cache.conv[self.layer], cache.ssm[self.layer]
        out = torch.empty(t, self.hv, self.dv, dtype=x.dtype, device=x.device)
        start = 0
        for b, n in enumerate(batch.seq_lens_cpu):
            sl = slice(start, start + n)
            slot = int(batch.state_slots[b])
            fresh = batch.context_lens_cpu[b] == 0  # a new sequence starts from zero state, whatever the slot holds
            mixed, conv_pool[slot] = causal_conv1d(qkv[sl], conv_w, None if fresh else conv_pool[slot])
            q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
            q = l2norm(q.float().view(n, self.hk, self.dk))
            k = l2norm(k.float().view(n, self.hk, self.dk))
            v = v.float().view(n, self.hv, self.dv)
            rule = gated_delta_chunked if n >= CHUNKED_MIN_TOKENS else gated_delta_recurrent
            o, ssm_pool[slot] = rule(q, k, v, g[sl], beta[sl], None if fresh else ssm_pool[slot], self.scale)
            out[sl] = o.to(x.dtype)
            start += n
        y = self.norm(out, z).reshape(t, self.value_dim)
        return self.out_proj(y)

    def decode_rows(self, x: torch.Tensor, batch: ForwardBatch, cache: HybridCache, lo: int, hi: int,
                    out: torch.Tensor | None = None, prep: fast.GemvPrep | None = None) -> torch.Tensor:
        """Rows lo .. hi-1 of a decode step (x: those rows; fast.mixer_decode): the fused in-projection with the conv
        (+ SiLU, state shift) on its first conv_dim features in one launch, the step, the out projection (into out
        when given)."""
        proj = fusion.fused(self, "in_proj")
        slots, ctx = batch.state_slots[lo:hi], batch.context_lens[lo:hi]
        conv_w = self.conv1d.weight[:, 0, :]
        conv = (conv_w, cache.conv[self.layer], slots, ctx, conv_w.shape[0])
        mixed, z, b, a = fast.linear(proj, x, True, conv=conv, prep=prep).split(proj.sizes, dim=-1)
        return self._step_and_out(x, mixed, z, b, a, cache.ssm[self.layer], slots, ctx, out=out)

    def verify_rows(self, x: torch.Tensor, batch: ForwardBatch, cache: HybridCache,
                    prep: fast.GemvPrep | None = None) -> torch.Tensor:
        """A verification's rows (batch.verify; fast path): each sequence's rows through the decode arithmetic in
        order (kernels/gated_delta/triton_verify.py), with the decode step's bits: the decode GEMV of the in
        projection, the conv over the rows without writing the window (its multi-token path equals the GEMV's conv
        epilogue), the verify step with the deployment's step shape and out-projection prep, the out projection.
        The state is left for commit_verify, which replays the kept rows from the inputs kept in the cache."""
        from ..kernels.gated_delta import triton_decode as td
        from ..kernels.gated_delta import triton_verify as tv

        qkv, z, b, a = self._project(x, True, prep)
        conv_w = self.conv1d.weight[:, 0, :]
        mixed = td.causal_conv(qkv, conv_w, cache.conv[self.layer], batch.cu_seqlens, batch.state_slots,
                               batch.context_lens, batch.max_seqlen, write_state=False)
        fmt = fast.gdn_step_prep(self.out_proj, x, self.dv, self.hv)
        dv_block = td.step_dv_block(throughput=fast.throughput_deployment(self))
        y = tv.gdn_verify_step(mixed, z, a, b, self.A_log, self.dt_bias, self.norm.weight, cache.ssm[self.layer],
                               batch.cu_seqlens, batch.state_slots, batch.context_lens, self.hk, self.norm.eps,
                               prep=fmt, dv_block=dv_block)
        y_prep = None
        if fmt is not None:
            y, y_prep = y[0], fast.GemvPrep(fmt, y[1])
        cache.verify_inputs[self.layer] = (qkv, mixed, z, a, b, fmt, dv_block)  # what commit_verify replays
        return fast.linear(self.out_proj, y, True, prep=y_prep)

    def commit_verify(self, batch: ForwardBatch, cache: HybridCache, keep: torch.Tensor) -> None:
        """After verify_rows: each sequence's conv window and state after its first keep[b] rows ([B] device)."""
        from ..kernels.gated_delta import triton_verify as tv

        qkv, mixed, z, a, b, fmt, dv_block = cache.verify_inputs.pop(self.layer)
        tv.conv_commit(qkv, cache.conv[self.layer], batch.cu_seqlens, batch.state_slots, batch.context_lens, keep)
        tv.gdn_verify_commit(mixed, z, a, b, self.A_log, self.dt_bias, self.norm.weight, cache.ssm[self.layer],
                             batch.cu_seqlens, batch.state_slots, batch.context_lens, keep, self.hk, self.norm.eps,
                             dv_block=dv_block, prep=fmt)

    def _step_and_out(self, x: torch.Tensor, mixed, z, b, a, ssm_pool: torch.Tensor, slots: torch.Tensor,
                      ctx: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The DeltaNet decode step over the conv's output, then the out projection (its prep made by the step)."""
        from ..kernels.gated_delta import triton_decode as td

        fmt = fast.gdn_step_prep(self.out_proj, x, self.dv, self.hv)  # the out projection's prep, made here
        y = td.gdn_decode_step(
            mixed, z, a, b, self.A_log, self.dt_bias, self.norm.weight, ssm_pool, slots, ctx, self.hk,
            self.norm.eps, prep=fmt, dv_block=td.step_dv_block(throughput=fast.throughput_deployment(self)),
        )
        y_prep = None
        if fmt is not None:
            y, y_prep = y[0], fast.GemvPrep(fmt, y[1])
        return fast.linear(self.out_proj, y, True, out=out, prep=y_prep)

    def _project(self, x: torch.Tensor, decode: bool, prep: fast.GemvPrep | None = None):
        """(qkv [T, conv_dim], z [T, value_dim], b [T, Hv], a [T, Hv]): one launch on the fused weight when fused
        (column views of one [T, total] output, row stride total: conv, the decode step and the gates take row
        strides), else one per projection."""
        proj = fusion.fused(self, "in_proj")
        if proj is not None:
            return fast.linear(proj, x, decode, prep=prep).split(proj.sizes, dim=-1)
        parts = (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
        return tuple(fast.linear(m, x, decode, prep=prep) for m in parts)

    def _conv_taps_major(self) -> torch.Tensor:
        """conv1d.weight as [C, K] over a [K, C] copy made once (64 KB a 35B-A3B layer): the prefill conv's per-tap
        weight loads are then contiguous over its channels (16-byte loads, not one 2-byte load a channel and tap).
        The same values, so never a bit. Made once (weights never move after loading)."""
        if self._conv_taps is None:
            self._conv_taps = self.conv1d.weight[:, 0, :].t().contiguous().t()
        return self._conv_taps

    def _conv_sections_fit(self) -> bool:
        """Whether the prefill conv can write q, k, v as three contiguous tensors (causal_conv(sections=)): the key
        width a multiple of a channel block it runs (triton_decode.conv_section_block; 64 for every Qwen3.5 size)."""
        from ..kernels.gated_delta.triton_decode import conv_section_block

        return self.value_dim > 0 and conv_section_block(self.key_dim, self.key_dim) > 0

    def _forward_fast(self, x: torch.Tensor, batch: ForwardBatch, cache: HybridCache,
                      prep: fast.GemvPrep | None = None) -> torch.Tensor:
        """All sequences at once: conv over the slot pool, then the fused step (decode) or fla's chunked rule."""
        from ..kernels.gated_delta import triton_decode as td

        t = x.shape[0]
        if batch.verify:
            return self.verify_rows(x, batch, cache, prep)
        decode = batch.max_seqlen == 1
        conv_pool, ssm_pool = cache.conv[self.layer], cache.ssm[self.layer]
        conv_w = self.conv1d.weight[:, 0, :]
        proj = fusion.fused(self, "in_proj")
        if decode and proj is not None and fast.conv_in_gemv(conv_pool, x):
            return fast.mixer_decode(self, "deltanet", x, batch, cache, prep)  # all rows, or two halves
        qkv, z, b, a = self._project(x, decode, prep)
        # prefill: q, k and v as three contiguous tensors (fla-core would copy column views to make them so)
        sections = None if decode or not self._conv_sections_fit() else (self.key_dim, self.key_dim)
        mixed = td.causal_conv(
            qkv, conv_w if decode else self._conv_taps_major(), conv_pool, batch.cu_seqlens, batch.state_slots,
            batch.context_lens, batch.max_seqlen, sections=sections,
        )
        if batch.max_seqlen == 1:
            return self._step_and_out(x, mixed, z, b, a, ssm_pool, batch.state_slots, batch.context_lens)
        g, beta = td.gdn_gates(a, b, self.A_log, self.dt_bias)
        q, k, v = mixed if isinstance(mixed, tuple) else mixed.split([self.key_dim, self.key_dim, self.value_dim], -1)
        o = td.gdn_prefill(
            q.reshape(t, self.hk, self.dk), k.reshape(t, self.hk, self.dk), v.reshape(t, self.hv, self.dv), g, beta,
            batch.cu_seqlens, ssm_pool, batch.state_slots, batch.context_lens, self.scale,
            cu_seqlens_cpu=batch.cu_seqlens_cpu,  # fla's chunk indices without a device -> host copy per layer
            memo=batch.memo,  # fla's chunk index, held by the batch: a captured prefill graph reads it at every replay
        )
        z = z.view(t, self.hv, self.dv)  # a column view of the projection's output, which the norm reads in place
        y = self.norm(o.to(x.dtype), z).reshape(t, self.value_dim)
        return fast.linear(self.out_proj, y)

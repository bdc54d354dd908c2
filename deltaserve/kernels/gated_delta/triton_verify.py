"""Gated DeltaNet for speculative verification: several consecutive tokens of a sequence through the decode
step's arithmetic, the state chained in registers and left unwritten, then a commit of the accepted prefix.

A verify forward gives each drafting sequence b its n_b = 1 + k_b tokens (the last sampled token, then k_b drafts)
as consecutive rows [cu_seqlens[b], cu_seqlens[b + 1]). Exactness asks every row's output to be the bits a
one-token decode step would give at that position. The decode step (triton_decode.gdn_decode_step) reads the
state, applies one token and writes it back in fp32; doing the same n_b times with the state held in registers is
the same arithmetic (an fp32 store and load are exact), so:

  gdn_verify_step   grid (B, Hv, DV / BV) as the decode step's (BV its state columns a program, the same warps:
                    the dk sums follow the program's layout): each program loads its state columns once, runs
                    triton_decode.delta_rule_update over the sequence's rows in order, writes each row's output
                    (and, where the decode step does, the out projection's prep) exactly as the decode step would;
                    the state is NOT written, unless n_b == 1 (nothing can be rejected: the decode step itself).
  gdn_verify_commit after the acceptance is known (keep [B] device-side: rows of each sequence to keep, 1 + its
                    accepted drafts): the same programs replay rows 0 .. keep_b - 1 from the same inputs (the conv
                    output, a, b) and write the state after the last kept row; sequences with n_b == 1 (already
                    written) are skipped.
  conv_commit       the conv windows: the verify runs triton_decode.causal_conv with write_state=False (its
                    multi-token path equals the decode GEMV's conv epilogue bit for bit: quant.triton_gemv's
                    contract), leaving each slot's window as it was; the commit writes the window after keep_b rows,
                    the last K-1 of [old window ; x_0 .. x_{keep_b - 1}] (x: the pre-conv projection rows).

Why recompute rather than keep a state per verified position (vLLM's way): per DeltaNet layer and sequence, with
S its state's bytes (2 MiB for 35B-A3B), per-position snapshots cost a read and k + 1 writes (and k + 1 state slots
of memory per sequence), the recompute a read in the verify and a read + a write in the commit: 3 S against
(k + 2) S, equal at k = 1 and cheaper from k = 2, with no extra memory. Cheaper still (2 S, a plain decode's) would
be to fold the commit into the NEXT step's kernels (replay the kept rows before the new ones); that needs every
path touching the state (prefill, the decode GEMV's conv epilogue) to know about pending rows: a follow-up.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_pdl import pdl_args, pdl_open, pdl_wait
from ..triton_sync import arrival_counters, last_arrival
from .triton_decode import (DV_BLOCK, HEAD_WARPS, _gated_norm_row, _prep_head, _state_columns, delta_rule_update,
                            prep_supported)


@triton.jit
def _verify_kernel(
    qkv_ptr, z_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, nw_ptr, ssm_ptr, cu_ptr, slot_ptr, ctx_ptr, o_ptr, ss_ptr,
    cnt_ptr, xp_ptr, xs_ptr,
    stride_qt, stride_zt, stride_at, stride_bt, stride_ss, stride_sh,
    stride_sk: tl.constexpr, stride_ot, stride_pt, stride_st, stride_sst,
    key_dim, scale, eps,
    HV: tl.constexpr, R: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
    PREP_BITS: tl.constexpr = 0, PREP_GROUP: tl.constexpr = 64, PDL: tl.constexpr = False,
):
    # grid (B, Hv, DV / BV). Program (b, h, j) owns columns [j BV, (j+1) BV) of state[slot b, h] and walks the
    # sequence's rows in order. BV == DV: the decode step's head form (_decode_kernel: the norm in the program);
    # else its split form (_gdn_step_kernel): each row's act-rounded slice and partial sum of squares ss[row, h, j],
    # then the head's last-arrival program normalises every row of the sequence, partials in order j = 0, 1, ..
    pdl_open(PDL)
    bi = tl.program_id(0)
    h = tl.program_id(1)
    j = tl.program_id(2)
    NS: tl.constexpr = DV // BV
    start = tl.load(cu_ptr + bi)
    n = tl.load(cu_ptr + bi + 1) - start
    rv = j * BV + tl.arange(0, BV)
    pdl_wait(PDL)  # every input (q/k/v, gates, z) comes from the kernels just before
    s, sp = _state_columns(ssm_ptr, slot_ptr, ctx_ptr, bi, h, rv, stride_ss, stride_sh, stride_sk, DK)
    act = o_ptr.dtype.element_ty
    for i in range(n):
        row = (start + i).to(tl.int64)
        s, q = delta_rule_update(qkv_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, s, row, h, rv, stride_qt, stride_at,
                                 stride_bt, key_dim, scale, R, DK, DV)
        o = tl.sum(s * q[:, None], axis=0)  # S^T q
        o_row = o_ptr + row * stride_ot + h * DV
        if NS == 1:  # the head form: the norm here, as _decode_kernel
            of = o.to(act).to(tl.float32)
            inv = 1.0 / tl.sqrt(tl.sum(of * of, axis=0) / DV + eps)
            y = _gated_norm_row(o_row, of, z_ptr + row * stride_zt + h * DV, nw_ptr, inv, rv, act)
            if PREP_BITS > 0:
                _prep_head(y, xp_ptr + row * stride_pt, xs_ptr + row * stride_st, h, rv, DV, HV * DV, PREP_BITS,
                           PREP_GROUP)
        else:
            of = o.to(act)
            tl.store(o_row + rv, of)
            of32 = of.to(tl.float32)
            tl.store(ss_ptr + row * stride_sst + h * NS + j, tl.sum(of32 * of32, axis=0))
    if n == 1:  # a row that cannot be rejected: its state written now, as the decode step writes it
        tl.store(sp, s)
    if NS > 1:
        if last_arrival(cnt_ptr + bi * HV + h, NS):
            ra = tl.arange(0, DV)
            for i in range(n):
                row = (start + i).to(tl.int64)
                o_row = o_ptr + row * stride_ot + h * DV
                parts = tl.load(ss_ptr + row * stride_sst + h * NS + tl.arange(0, NS), cache_modifier=".cg")
                inv = 1.0 / tl.sqrt(tl.sum(parts, axis=0) / DV + eps)
                full = tl.load(o_row + ra, cache_modifier=".cg").to(tl.float32)
                y = _gated_norm_row(o_row, full, z_ptr + row * stride_zt + h * DV, nw_ptr, inv, ra, act)
                if PREP_BITS > 0:
                    _prep_head(y, xp_ptr + row * stride_pt, xs_ptr + row * stride_st, h, ra, DV, HV * DV, PREP_BITS,
                               PREP_GROUP)


@triton.jit
def _commit_kernel(
    qkv_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, ssm_ptr, cu_ptr, slot_ptr, ctx_ptr, keep_ptr,
    stride_qt, stride_at, stride_bt, stride_ss, stride_sh, stride_sk: tl.constexpr,
    key_dim, scale,
    R: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, PDL: tl.constexpr = False,
):
    # grid (B, Hv, DV / BV), the verify's programs: replay rows 0 .. keep - 1 of sequence b on the state columns
    # and write them back. n == 1: the verify wrote this sequence's state already.
    pdl_open(PDL)
    bi = tl.program_id(0)
    h = tl.program_id(1)
    rv = tl.program_id(2) * BV + tl.arange(0, BV)
    start = tl.load(cu_ptr + bi)
    n = tl.load(cu_ptr + bi + 1) - start
    pdl_wait(PDL)
    keep = tl.minimum(tl.load(keep_ptr + bi).to(tl.int32), n.to(tl.int32))
    if n > 1 and keep > 0:
        s, sp = _state_columns(ssm_ptr, slot_ptr, ctx_ptr, bi, h, rv, stride_ss, stride_sh, stride_sk, DK)
        for i in range(keep):
            s, q = delta_rule_update(qkv_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, s, (start + i).to(tl.int64), h, rv,
                                     stride_qt, stride_at, stride_bt, key_dim, scale, R, DK, DV)
        tl.store(sp, s)


@triton.jit
def _conv_commit_kernel(x_ptr, pool_ptr, cu_ptr, slot_ptr, ctx_ptr, keep_ptr, C, stride_xt, stride_ps, stride_pc,
                        stride_pk, KW: tl.constexpr, KWP: tl.constexpr, BC: tl.constexpr, PDL: tl.constexpr = False):
    # grid (B, cdiv(C, BC)): window'[j] = ([window ; x_0 .. x_{n-1}])[keep + j], j < KW - 1 (the window's KW - 1
    # entries first, oldest first; zeros for a fresh sequence). Every read before the barrier, then the stores.
    pdl_open(PDL)
    bi = tl.program_id(0)
    rc = tl.program_id(1) * BC + tl.arange(0, BC)
    c_mask = rc < C
    start = tl.load(cu_ptr + bi)
    n = tl.load(cu_ptr + bi + 1) - start
    pdl_wait(PDL)
    keep = tl.minimum(tl.load(keep_ptr + bi).to(tl.int32), n.to(tl.int32))
    slot = tl.load(slot_ptr + bi).to(tl.int64)
    fresh = tl.load(ctx_ptr + bi) == 0
    rj = tl.arange(0, KWP)
    j_mask = rj < KW - 1
    src = keep + rj  # index into [window (KW - 1) ; x rows]
    from_x = src >= KW - 1
    st = pool_ptr + slot * stride_ps + rc[None, :] * stride_pc
    xv = tl.load(x_ptr + (start + src - (KW - 1)).to(tl.int64)[:, None] * stride_xt + rc[None, :],
                 mask=(j_mask & from_x)[:, None] & c_mask[None, :], other=0.0)
    sv = tl.load(st + src[:, None] * stride_pk, mask=(j_mask & ~from_x & ~fresh)[:, None] & c_mask[None, :],
                 other=0.0)
    new = tl.where(from_x[:, None], xv.to(pool_ptr.dtype.element_ty), sv.to(pool_ptr.dtype.element_ty))
    tl.debug_barrier()
    tl.store(st + rj[:, None] * stride_pk, new, mask=(j_mask & (keep > 0))[:, None] & c_mask[None, :])


def _check(qkv, a, b, ssm_pool, cu_seqlens, state_slots, context_lens, num_k_heads):
    t, c = qkv.shape
    _, hv, dk, dv = ssm_pool.shape
    key_dim = num_k_heads * dk
    if c != 2 * key_dim + hv * dv or hv % num_k_heads:
        raise ValueError(f"gdn verify: qkv has {c} channels; with Hk={num_k_heads}, pool {tuple(ssm_pool.shape)} "
                         f"expected {2 * key_dim + hv * dv} and Hv divisible by Hk")
    if a.shape != (t, hv) or b.shape != (t, hv):
        raise ValueError(f"gdn verify: a {tuple(a.shape)}, b {tuple(b.shape)} must be [{t}, {hv}]")
    nseq = state_slots.numel()
    if cu_seqlens.numel() != nseq + 1 or context_lens.numel() != nseq:
        raise ValueError(f"gdn verify: {nseq} state slots, {cu_seqlens.numel()} cu_seqlens, {context_lens.numel()} "
                         "context lengths")
    if ssm_pool.dtype != torch.float32 or ssm_pool.stride(-1) != 1:
        raise ValueError("gdn verify: the ssm pool must be fp32 with a contiguous dv axis")
    for name, x in (("qkv", qkv), ("a", a), ("b", b)):
        if x.stride(-1) != 1:
            raise ValueError(f"gdn verify: {name} must be contiguous along its last axis")
    return nseq, hv, dk, dv, key_dim


def _columns(dv: int, dv_block: int | None) -> int:
    bv = dv if dv_block is None or dv_block >= dv else dv_block
    if dv % bv or bv & (bv - 1):
        raise ValueError(f"gdn verify: dv_block {dv_block} must be a power of two dividing dv = {dv}")
    return bv


def gdn_verify_step(
    qkv_conv: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor,
    dt_bias: torch.Tensor, norm_weight: torch.Tensor, ssm_pool: torch.Tensor, cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor, context_lens: torch.Tensor, num_k_heads: int, eps: float,
    out: torch.Tensor | None = None, dv_block: int | None = DV_BLOCK, num_warps: int | None = None,
    prep: tuple[int, int] | None = None,
):
    """The decode step (triton_decode.gdn_decode_step, same arguments and outputs) for B sequences of n_b >= 1
    consecutive rows each (cu_seqlens [B+1]; state_slots, context_lens [B] per sequence; every other tensor per
    row: qkv_conv [T, C], z [T, Hv*dv], a, b [T, Hv]). Row i of a sequence gets the bits the decode step would give
    it after rows 0 .. i-1 were decoded; the state is not written (gdn_verify_commit writes it once the kept rows
    are known), except for a sequence of one row, whose state is written as the decode step writes it.
    dv_block, num_warps, prep: the deployment's decode step's (they are part of a row's bits)."""
    t = qkv_conv.shape[0]
    nseq, hv, dk, dv, key_dim = _check(qkv_conv, a, b, ssm_pool, cu_seqlens, state_slots, context_lens, num_k_heads)
    if z.shape != (t, hv * dv) or z.stride(-1) != 1 or norm_weight.numel() != dv:
        raise ValueError(f"gdn_verify_step: z {tuple(z.shape)}, norm {tuple(norm_weight.shape)} do not fit "
                         f"[{t}, {hv * dv}], dv={dv}")
    o = torch.empty(t, hv * dv, dtype=qkv_conv.dtype, device=qkv_conv.device) if out is None else out
    bits, group = prep or (0, 64)
    if prep is not None and not prep_supported(dv, bits, group):
        raise ValueError(f"gdn_verify_step: prep {prep} needs bits 4 or 8 and dv = {dv} a multiple of the group")
    xp = torch.empty(t, hv * dv, dtype=torch.float32, device=o.device) if prep else o
    xs = torch.empty(t, hv * dv // group, dtype=torch.float32, device=o.device) if prep else o
    done = (o, (xp, xs)) if prep else o
    if nseq == 0 or t == 0:
        return done
    bv = _columns(dv, dv_block)
    ns = dv // bv
    ss = torch.empty(t, hv * ns, dtype=torch.float32, device=o.device) if ns > 1 else o
    counters = arrival_counters(o.device, nseq * hv) if ns > 1 else o
    _verify_kernel[(nseq, hv, ns)](
        qkv_conv, z, a, b, a_log, dt_bias, norm_weight, ssm_pool, cu_seqlens, state_slots, context_lens, o, ss,
        counters, xp, xs,
        qkv_conv.stride(0), z.stride(0), a.stride(0), b.stride(0), ssm_pool.stride(0), ssm_pool.stride(1),
        ssm_pool.stride(2), o.stride(0), xp.stride(0), xs.stride(0), ss.stride(0) if ns > 1 else 0,
        key_dim, dk ** -0.5, eps,
        HV=hv, R=hv // num_k_heads, DK=dk, DV=dv, BV=bv, PREP_BITS=bits, PREP_GROUP=group,
        num_warps=num_warps or (4 if ns > 1 else HEAD_WARPS), **pdl_args(o),
    )
    return done


def gdn_verify_commit(
    qkv_conv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
    ssm_pool: torch.Tensor, cu_seqlens: torch.Tensor, state_slots: torch.Tensor, context_lens: torch.Tensor,
    keep: torch.Tensor, num_k_heads: int, dv_block: int | None = DV_BLOCK, num_warps: int | None = None,
) -> None:
    """Write each sequence's state after its first keep[b] rows (device tensor [B]; clipped to n_b; 0 leaves the
    state as it was) of the gdn_verify_step just run on the same inputs, in place at state_slots. Sequences of one
    row are skipped (the verify wrote them). dv_block, num_warps: the verify's (the state's bits follow them)."""
    nseq, hv, dk, dv, key_dim = _check(qkv_conv, a, b, ssm_pool, cu_seqlens, state_slots, context_lens, num_k_heads)
    if keep.numel() != nseq:
        raise ValueError(f"gdn_verify_commit: keep has {keep.numel()} entries for {nseq} sequences")
    if nseq == 0:
        return
    bv = _columns(dv, dv_block)
    ns = dv // bv
    _commit_kernel[(nseq, hv, ns)](
        qkv_conv, a, b, a_log, dt_bias, ssm_pool, cu_seqlens, state_slots, context_lens, keep,
        qkv_conv.stride(0), a.stride(0), b.stride(0), ssm_pool.stride(0), ssm_pool.stride(1), ssm_pool.stride(2),
        key_dim, dk ** -0.5, R=hv // num_k_heads, DK=dk, DV=dv, BV=bv,
        num_warps=num_warps or (4 if ns > 1 else HEAD_WARPS), **pdl_args(ssm_pool),
    )


CONV_COMMIT_BLOCK = 256  # channels a program (a 35B-A3B layer: 32 programs a sequence)


def conv_commit(x: torch.Tensor, conv_pool: torch.Tensor, cu_seqlens: torch.Tensor, state_slots: torch.Tensor,
                context_lens: torch.Tensor, keep: torch.Tensor) -> None:
    """Each sequence's conv window [C, K-1] after its first keep[b] rows (device [B], clipped to n_b; 0: unchanged)
    of x [T, C], the pre-conv projection rows a verify ran through causal_conv(write_state=False): the last K-1 of
    [window ; x rows 0 .. keep_b - 1] (a fresh sequence's window reads as zeros). In place at state_slots."""
    t, c = x.shape
    nseq = state_slots.numel()
    if conv_pool.shape[1] != c or x.stride(-1) != 1 or keep.numel() != nseq or cu_seqlens.numel() != nseq + 1:
        raise ValueError(f"conv_commit: x {tuple(x.shape)} (contiguous channels), pool {tuple(conv_pool.shape)}, "
                         f"{keep.numel()} keep and {cu_seqlens.numel()} cu_seqlens for {nseq} sequences disagree")
    if nseq == 0:
        return
    kw = conv_pool.shape[2] + 1
    _conv_commit_kernel[(nseq, triton.cdiv(c, CONV_COMMIT_BLOCK))](
        x, conv_pool, cu_seqlens, state_slots, context_lens, keep, c, x.stride(0), conv_pool.stride(0),
        conv_pool.stride(1), conv_pool.stride(2), KW=kw, KWP=triton.next_power_of_2(kw - 1), BC=CONV_COMMIT_BLOCK,
        num_warps=4, **pdl_args(conv_pool),
    )

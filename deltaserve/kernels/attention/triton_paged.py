"""Paged KV cache on the GPU: append, decode attention (fixed-size splits), varlen causal prefill attention.

Same meaning as `kernels/attention/reference.py` (write_kv, paged_attention), same layouts:

  k_cache, v_cache [num_blocks, block_size, Hkv, D]   block_tables [B, max_blocks] int32
New token i of sequence b sits at cache index ctx_b + i and attends to cache indices 0..ctx_b + i (the cache
already holds the new K/V). Query head h uses KV head h // (Hq / Hkv). Softmax statistics in fp32; the P.V
product takes P rounded to the activation dtype (tensor cores), accumulation in fp32.

Batch invariance: each program's work depends only on its own sequence. Decode splits a context into chunks of
split_tokens() (a launch-table constant, not a function of the batch; with long_split(), a multiple of it for rows
longer than a constant) and merges them in ascending order, so a sequence gets the same bits alone or in any batch.
A row of kv_len <= split_tokens() (one split) is finished by its split program (the merge program of that row returns at
once): which path a row takes depends on its own length only, and the direct path computes what the merge would
(weight exp2(0) = 1 on the only split), so a row's bits do not depend on the launch either. Both kernels are
always launched for a given host bound max_kv_len (graph replay safe); only a bound <= split_tokens(), where every
row is single-split, leaves the merge launch out.

fp8 caches (kv_fp8.py: e4m3 rows with an fp32 scale per (token, KV head), k_scale/v_scale [num_blocks,
block_size, Hkv]): a key's scores are (q . k8) * k_scale (the scale applied to the fp32 scores, not the elements)
and a value's weight in P.V is p * v_scale (then rounded like P), so the fp8 codes enter the MMA exactly.

Optional attention output gate (Qwen3.5 gated attention), applied in the epilogue with the reference's rounding
(model/attention.py: o * torch.sigmoid(gate) on bf16 tensors):  out = bf16( bf16(o) * bf16(sigmoid(gate)) ).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ...utils import tuning
from ..launch_table import value as launch_value
from ..quant.triton_gemv import pairwise_sums, prep_x
from ..triton_common import code_prescale, dot_f32, mma
from ..triton_pdl import pdl_args, pdl_open, pdl_wait
from .triton_kv_fp8 import fp8_scale, store_fp8
from .kv_fp8 import check_cache

# decode: tokens per split, fixed so the merge order of a row never depends on the batch. 64: at 512 tokens the
# split programs' chains are half as long (5.9 vs 9.8 us a layer on the H200), at 32K the merge's extra work costs
# less than that gains everywhere else (lab/NOTES.md)
_LOG2E = 1.4426950408889634


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr, stride_kt, stride_kh, stride_vt,
                     stride_vh, stride_cs, stride_ch, HKV, D: tl.constexpr, BD: tl.constexpr,
                     FP8: tl.constexpr = False):
    # grid (T, Hkv); the caches are viewed as [num_blocks * block_size, Hkv, D] (FP8: scales [.., Hkv])
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # padding token
        return
    rd = tl.arange(0, BD)
    m = rd < D
    k = tl.load(k_ptr + t.to(tl.int64) * stride_kt + h * stride_kh + rd, mask=m)
    v = tl.load(v_ptr + t.to(tl.int64) * stride_vt + h * stride_vh + rd, mask=m)
    dst = slot * stride_cs + h * stride_ch + rd
    if FP8:
        kf = k.to(tl.float32)
        vf = v.to(tl.float32)
        ks = fp8_scale(tl.max(tl.where(m, tl.abs(kf), 0.0), axis=0))
        vs = fp8_scale(tl.max(tl.where(m, tl.abs(vf), 0.0), axis=0))
        store_fp8(kc_ptr + dst, kf, ks, m)
        store_fp8(vc_ptr + dst, vf, vs, m)
        tl.store(ks_ptr + slot * HKV + h, ks)
        tl.store(vs_ptr + slot * HKV + h, vs)
    else:
        tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=m)
        tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=m)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> None:
    """Store k, v [T, Hkv, D] at flat slots (block * block_size + offset); negative slots are skipped. fp8 caches:
    each row quantised as kv_fp8.quantize_rows, its scale into k_scale / v_scale."""
    nb, bs, hkv, d = k_cache.shape
    if k.shape != v.shape or tuple(k.shape[1:]) != (hkv, d) or slot_mapping.numel() != k.shape[0]:
        raise ValueError(f"write_kv: k {tuple(k.shape)}, v {tuple(v.shape)}, {slot_mapping.numel()} slots for a "
                         f"cache of [.., .., {hkv}, {d}]")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("write_kv: caches must be contiguous and k/v contiguous along D")
    fp8 = check_cache(k_cache, v_cache, k_scale, v_scale, "write_kv")
    if k.shape[0]:
        _write_kv_kernel[(k.shape[0], hkv)](
            k, v, k_cache, v_cache, slot_mapping, k_scale if fp8 else k, v_scale if fp8 else v, k.stride(0),
            k.stride(1), v.stride(0), v.stride(1), hkv * d, d, hkv, D=d, BD=triton.next_power_of_2(d), FP8=fp8,
            num_warps=1 if d <= 128 else 2,
        )


@triton.jit
def _kv_rows(table_row, pos, BS: tl.constexpr):
    """Flat cache rows of token positions pos (a block-table lookup per token)."""
    blk = tl.load(table_row + pos // BS, mask=pos >= 0, other=0).to(tl.int64)
    return blk * BS + pos % BS


@triton.jit
def _load_rows(c_ptr, sc_ptr, off, srow, valid, act: tl.constexpr, FP8: tl.constexpr):
    """Cache rows [BN, D] at off (0 where not valid) in the activation dtype act, and for FP8 their scales [BN]
    (at srow of the [rows, Hkv] scales; 0 where not valid): e4m3 -> act is exact, the scale is the caller's."""
    x = tl.load(c_ptr + off, mask=valid[:, None], other=0.0)
    sc = 0.0
    if FP8:
        x = x.to(act)
        sc = tl.load(sc_ptr + srow, mask=valid, other=0.0)
    return x, sc


@triton.jit
def _gated(o, gate_ptrs, mask, HAS_GATE: tl.constexpr):
    """o (fp32, any shape) -> o rounded to the gate's dtype, times bf16(sigmoid(gate)) in fp32 when HAS_GATE (the
    product is rounded once by the caller's store). sigmoid = 1 / (1 + exp(-g)) with an IEEE division."""
    if HAS_GATE:
        g = tl.load(gate_ptrs, mask=mask, other=0.0)
        sig = tl.math.div_rn(tl.full(g.shape, 1.0, tl.float32), 1.0 + tl.exp(-g.to(tl.float32)))
        o = o.to(g.dtype).to(tl.float32) * sig.to(g.dtype).to(tl.float32)
    return o


@triton.jit
def _split_tile(kc_ptr, vc_ptr, ks_ptr, vs_ptr, table_row, pos, lim, kvh, rd, stride_cr, stride_ch,
                D: tl.constexpr, BS: tl.constexpr, FP8: tl.constexpr):
    """The K and V rows [BN, D] of token positions pos (0 at positions >= lim) as stored (e4m3 for FP8) and, for FP8,
    their scales [BN] (0 at positions >= lim): both loads issued together, nothing converted yet."""
    valid = pos < lim
    rows = _kv_rows(table_row, tl.where(valid, pos, -1), BS)
    off = rows[:, None] * stride_cr + kvh * stride_ch + rd[None, :]
    k = tl.load(kc_ptr + off, mask=valid[:, None], other=0.0)
    v = tl.load(vc_ptr + off, mask=valid[:, None], other=0.0)
    ksc = 0.0
    vsc = 0.0
    if FP8:
        srow = rows * (stride_cr // D) + kvh
        ksc = tl.load(ks_ptr + srow, mask=valid, other=0.0)
        vsc = tl.load(vs_ptr + srow, mask=valid, other=0.0)
    return valid, k, v, ksc, vsc


@triton.jit
def _split_tile_settled(kc_ptr, vc_ptr, ks_ptr, vs_ptr, table_row, pos, lim, L, kvh, rd, stride_cr, stride_ch,
                        D: tl.constexpr, BS: tl.constexpr, FP8: tl.constexpr, PDL_WAIT: tl.constexpr):
    """_split_tile's values for a launch made with PDL that has not waited yet, where every position but the row's
    newest (L - 1) was written before this forward began (the caller's `settled`): the K rows of those positions
    (and their scales), their block-table entries and the row's length are requested first, then the wait for the
    kernel that wrote q and the newest token's K/V, then the newest K row (masked in) and the V tile. The same
    values, so the same tile."""
    valid = pos < lim
    rows = _kv_rows(table_row, tl.where(valid, pos, -1), BS)
    off = rows[:, None] * stride_cr + kvh * stride_ch + rd[None, :]
    old = pos < tl.minimum(lim, L - 1)
    k = tl.load(kc_ptr + off, mask=old[:, None], other=0.0)
    ksc = 0.0
    vsc = 0.0
    srow = rows * (stride_cr // D) + kvh
    if FP8:
        ksc = tl.load(ks_ptr + srow, mask=old, other=0.0)
    pdl_wait(PDL_WAIT)
    new = valid & (pos == L - 1)
    k = tl.load(kc_ptr + off, mask=new[:, None], other=k)
    v = tl.load(vc_ptr + off, mask=valid[:, None], other=0.0)
    if FP8:
        ksc = tl.load(ks_ptr + srow, mask=new, other=ksc)
        vsc = tl.load(vs_ptr + srow, mask=valid, other=0.0)
    return valid, k, v, ksc, vsc


@triton.jit
def _split_step(q, k, v, ksc, vsc, valid, m_i, l_i, acc, qk_scale, F32: tl.constexpr, FP8: tl.constexpr):
    """One online-softmax step of the split program over a tile (k, v as stored: e4m3 -> q's dtype is exact)."""
    s = mma(q, tl.trans(k.to(q.dtype)), tl.zeros((q.shape[0], k.shape[0]), dtype=tl.float32), F32)
    if FP8:
        s = s * ksc[None, :]
    s = s * qk_scale  # log2 domain
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    pv = p
    if FP8:
        pv = p * vsc[None, :]
    acc = mma(pv.to(q.dtype), v.to(q.dtype), acc * alpha[:, None], F32)
    return m_new, l_i, acc


@triton.jit
def _split_partial(q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, table_row, start, span, L, kvh, rd, stride_cr, stride_ch,
                   qk_scale, GP: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, SPLIT: tl.constexpr,
                   BN: tl.constexpr, F32: tl.constexpr, FP8: tl.constexpr, FLAT: tl.constexpr):
    """One split's (m, l, acc) over tokens [start, start + span) of a row of length L: BN tokens per step. span: the
    split's tokens, SPLIT (constexpr) or a long row's (_split_span). FLAT (with BN == SPLIT): no loop, so a caller's
    loop over splits is the innermost one and Triton can pipeline its loads; the loop otherwise (the form the
    non-strided launch was measured with: fp8 compiles to 135 registers that way, 167 flat)."""
    m_i = tl.full((GP,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((GP,), dtype=tl.float32)
    acc = tl.zeros((GP, D), dtype=tl.float32)
    lim = tl.minimum(L, start + span)
    if FLAT and BN == SPLIT:
        valid, k, v, ksc, vsc = _split_tile(kc_ptr, vc_ptr, ks_ptr, vs_ptr, table_row, start + tl.arange(0, BN), lim,
                                            kvh, rd, stride_cr, stride_ch, D, BS, FP8)
        m_i, l_i, acc = _split_step(q, k, v, ksc, vsc, valid, m_i, l_i, acc, qk_scale, F32, FP8)
    else:
        for n0 in tl.range(start, start + span, BN):
            valid, k, v, ksc, vsc = _split_tile(kc_ptr, vc_ptr, ks_ptr, vs_ptr, table_row, n0 + tl.arange(0, BN),
                                                lim, kvh, rd, stride_cr, stride_ch, D, BS, FP8)
            m_i, l_i, acc = _split_step(q, k, v, ksc, vsc, valid, m_i, l_i, acc, qk_scale, F32, FP8)
    return m_i, l_i, acc


@triton.jit
def _decode_split_kernel(
    q_ptr, kc_ptr, vc_ptr, table_ptr, lens_ptr, po_ptr, pm_ptr, pl_ptr, o_ptr, gate_ptr, ks_ptr, vs_ptr,
    stride_qb, stride_qh, stride_tb, stride_cr, stride_ch, stride_pb, stride_ph, stride_ps, stride_ob, stride_oh,
    stride_gb, stride_gh, qk_scale,
    G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, SPLIT: tl.constexpr,
    BN: tl.constexpr, F32: tl.constexpr, HAS_GATE: tl.constexpr, LENS_ADD: tl.constexpr,
    FP8: tl.constexpr = False, STRIDED: tl.constexpr = False, PDL: tl.constexpr = False,
    SETTLED: tl.constexpr = False, LONG_FROM: tl.constexpr = 0, LONG_TILES: tl.constexpr = 1,
    LONG_BN: tl.constexpr = 32,
):
    # grid (B, Hkv, P): the G query heads of one KV head over tokens [sp*SPLIT, (sp+1)*SPLIT), BN per step. P is
    # the row's maximum number of splits (program p runs split p), or, STRIDED, any P: program p runs the splits
    # p, p + P, p + 2P, ... in a loop whose next split's loads Triton can request while this one computes. A split's
    # arithmetic is the same whichever program runs it, so P and STRIDED are launch choices (never a row's bits).
    # SETTLED (one step a split, not STRIDED): the row's length, block table and K/V rows of every position but the
    # newest were written before this forward's first launch (which is made without PDL, so they are complete): the
    # K rows are requested before the PDL wait (_split_tile_settled), q, the newest K row and V after it (sm_90, bf16:
    # 155 registers, the plain form's 150; with V early too 227).
    # LONG_FROM > 0 (not STRIDED): a row longer than LONG_FROM tokens takes splits of LONG_TILES * SPLIT tokens
    # (_split_span), LONG_BN tokens a step, all after the PDL wait; programs past a row's last split return at once.
    pdl_open(PDL)
    tl.static_assert(not SETTLED or (BN == SPLIT and not STRIDED), "the settled form: one tile a split, a program a "
                     "split")
    tl.static_assert(LONG_FROM == 0 or (not STRIDED and LONG_FROM >= SPLIT), "long splits: a program a split, and a "
                     "long row never one split of SPLIT tokens")
    if not SETTLED:
        pdl_wait(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    L = tl.load(lens_ptr + b) + LENS_ADD
    if not STRIDED:
        if tl.program_id(2) * _split_span(L, SPLIT, LONG_FROM, LONG_TILES) >= L:  # past the row's last split
            return
    rg = tl.arange(0, GP)
    g_mask = rg < G
    rd = tl.arange(0, D)
    heads = kvh * G + rg
    hd, dd, gm = heads[:, None], rd[None, :], g_mask[:, None]  # [GP, D] tiles
    if LONG_FROM > 0:  # a long row's split: after the wait, LONG_BN tokens a step (smaller tiles than BN's keep
        # the program's registers at the SPLIT-token form's, so as many programs stay resident), then its partial
        if L > LONG_FROM:
            if SETTLED:
                pdl_wait(PDL)
            sp = tl.program_id(2)
            q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + hd * stride_qh + dd, mask=gm, other=0.0)
            m_i, l_i, acc = _split_partial(q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, table_ptr + b.to(tl.int64) * stride_tb,
                                           sp * (SPLIT * LONG_TILES), SPLIT * LONG_TILES, L, kvh, rd, stride_cr,
                                           stride_ch, qk_scale, GP, D, BS, SPLIT * LONG_TILES, LONG_BN, F32, FP8, False)
            _split_store(acc, m_i, l_i, L, b, sp, heads, g_mask, hd, dd, gm, po_ptr, pm_ptr, pl_ptr, o_ptr, gate_ptr,
                         stride_pb, stride_ph, stride_ps, stride_ob, stride_oh, stride_gb, stride_gh, D, SPLIT,
                         HAS_GATE)
            return
    if SETTLED:  # the tile (waiting inside, after the K rows' requests), then q; one step from (-inf, 0, 0) and the
        # store: _split_partial's one-step loop, so the same bits
        sp = tl.program_id(2)
        valid, k, v, ksc, vsc = _split_tile_settled(
            kc_ptr, vc_ptr, ks_ptr, vs_ptr, table_ptr + b.to(tl.int64) * stride_tb, sp * SPLIT + tl.arange(0, SPLIT),
            tl.minimum(L, sp * SPLIT + SPLIT), L, kvh, rd, stride_cr, stride_ch, D, BS, FP8, PDL)
        q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + hd * stride_qh + dd, mask=gm, other=0.0)
        m_i, l_i, acc = _split_step(q, k, v, ksc, vsc, valid, tl.full((GP,), float("-inf"), dtype=tl.float32),
                                    tl.zeros((GP,), dtype=tl.float32), tl.zeros((GP, D), dtype=tl.float32), qk_scale,
                                    F32, FP8)
        _split_store(acc, m_i, l_i, L, b, sp, heads, g_mask, hd, dd, gm, po_ptr, pm_ptr, pl_ptr, o_ptr, gate_ptr,
                     stride_pb, stride_ph, stride_ps, stride_ob, stride_oh, stride_gb, stride_gh, D, SPLIT, HAS_GATE)
        return
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + hd * stride_qh + dd, mask=gm, other=0.0)
    table_row = table_ptr + b.to(tl.int64) * stride_tb
    if STRIDED:
        for sp in tl.range(tl.program_id(2), tl.cdiv(L, SPLIT), tl.num_programs(2)):
            m_i, l_i, acc = _split_partial(q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, table_row, sp * SPLIT, SPLIT, L, kvh,
                                           rd, stride_cr, stride_ch, qk_scale, GP, D, BS, SPLIT, BN, F32, FP8, True)
            _split_store(acc, m_i, l_i, L, b, sp, heads, g_mask, hd, dd, gm, po_ptr, pm_ptr, pl_ptr, o_ptr, gate_ptr,
                         stride_pb, stride_ph, stride_ps, stride_ob, stride_oh, stride_gb, stride_gh, D, SPLIT,
                         HAS_GATE)
    else:
        sp = tl.program_id(2)
        m_i, l_i, acc = _split_partial(q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, table_row, sp * SPLIT, SPLIT, L, kvh, rd,
                                       stride_cr, stride_ch, qk_scale, GP, D, BS, SPLIT, BN, F32, FP8, False)
        _split_store(acc, m_i, l_i, L, b, sp, heads, g_mask, hd, dd, gm, po_ptr, pm_ptr, pl_ptr, o_ptr, gate_ptr,
                     stride_pb, stride_ph, stride_ps, stride_ob, stride_oh, stride_gb, stride_gh, D, SPLIT, HAS_GATE)


@triton.jit
def _split_span(L, SPLIT: tl.constexpr, LONG_FROM: tl.constexpr, LONG_TILES: tl.constexpr):
    """Tokens a split of a row of length L: SPLIT, or LONG_TILES * SPLIT for a row longer than LONG_FROM (> 0). A
    function of the row's own length, so its summation order never depends on the batch."""
    if LONG_FROM > 0:
        return tl.where(L > LONG_FROM, SPLIT * LONG_TILES, SPLIT)
    else:
        return SPLIT


@triton.jit
def _split_store(acc, m_i, l_i, L, b, sp, heads, g_mask, hd, dd, gm, po_ptr, pm_ptr, pl_ptr, o_ptr, gate_ptr,
                 stride_pb, stride_ph, stride_ps, stride_ob, stride_oh, stride_gb, stride_gh, D: tl.constexpr,
                 SPLIT: tl.constexpr, HAS_GATE: tl.constexpr):
    """A split's result: the row's output when it is the row's only split (the merge of one split is the
    identity), else its partial (acc, m, l) for the merge."""
    if L <= SPLIT:
        o = acc / l_i[:, None]
        o = _gated(o, gate_ptr + b.to(tl.int64) * stride_gb + hd * stride_gh + dd, gm, HAS_GATE)
        tl.store(o_ptr + b.to(tl.int64) * stride_ob + hd * stride_oh + dd, o.to(o_ptr.dtype.element_ty), mask=gm)
    else:
        base = b.to(tl.int64) * stride_pb + sp * stride_ps
        tl.store(po_ptr + (base + hd * stride_ph) * D + dd, acc, mask=gm)
        tl.store(pm_ptr + base + heads * stride_ph, m_i, mask=g_mask)
        tl.store(pl_ptr + base + heads * stride_ph, l_i, mask=g_mask)


@triton.jit
def _prep_columns(x, xp_row, xs_row, c0, BD: tl.constexpr, K: tl.constexpr, BITS: tl.constexpr,
                  GROUP: tl.constexpr):
    """The decode GEMV's prep (quant.triton_gemv.prep_row's layout and arithmetic) of columns [c0, c0 + BD) of a
    row of K features, x their stored values (the activation dtype): xp[i * K/PACK + j] = x[j * PACK + i] *
    2^-(BITS * (i % PACK/2)) and xs[g] = pairwise_sums of group g. c0 and BD are multiples of GROUP, so this
    block owns whole groups and every sum is prep_row's tree over the same values: the same bits as the prep
    launch."""
    PACK: tl.constexpr = 32 // BITS
    KW: tl.constexpr = K // PACK
    NG: tl.constexpr = BD // GROUP
    xf = x.to(tl.float32)
    c = c0 + tl.arange(0, BD)
    i = c % PACK
    tl.store(xp_row + i * KW + c // PACK, xf * code_prescale(i, BITS))
    tl.store(xs_row + c0 // GROUP + tl.arange(0, NG), pairwise_sums(tl.reshape(xf, (NG, GROUP)), NG, GROUP))


@triton.jit
def _decode_merge_kernel(po_ptr, pm_ptr, pl_ptr, lens_ptr, o_ptr, gate_ptr, xp_ptr, xs_ptr, stride_pb, stride_ph,
                         stride_ps, stride_ob, stride_oh, stride_gb, stride_gh, stride_xp, stride_xs,
                         D: tl.constexpr, BD: tl.constexpr, SPLIT: tl.constexpr, BSP: tl.constexpr,
                         HAS_GATE: tl.constexpr, LENS_ADD: tl.constexpr, HQ: tl.constexpr = 1,
                         PREP_BITS: tl.constexpr = 0, GROUP: tl.constexpr = 64, PDL: tl.constexpr = False,
                         LONG_FROM: tl.constexpr = 0, LONG_TILES: tl.constexpr = 1):
    # grid (B, Hq, D / BD): columns [j*BD, (j+1)*BD) of one row, merged over its splits in ONE pass, BSP splits
    # per step in ascending split order with a running maximum (acc and l rescaled when it grows). The order
    # depends on the row's length only: never on the batch, nor on the column block (every block computes the
    # same m and l the same way). One pass and D blocks: at 32k tokens a row has 256 splits, and the two-pass
    # merge of whole rows (16 programs at B = 1, 32 dependent steps each) was latency-bound.
    # PREP_BITS > 0: the block also writes the out projection's decode GEMV prep of its columns (_prep_columns;
    # row b of xp / xs at pitches stride_xp / stride_xs, K = HQ * D, the output's rows contiguous), also for a
    # single-split row, whose output its split program wrote before this launch's wait.
    pdl_open(PDL)
    pdl_wait(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    L = tl.load(lens_ptr + b) + LENS_ADD
    if L <= SPLIT:  # single split: the split program wrote this row's output
        if PREP_BITS > 0:
            rd = tl.program_id(2) * BD + tl.arange(0, BD)
            o = tl.load(o_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + rd)
            _prep_columns(o, xp_ptr + b.to(tl.int64) * stride_xp, xs_ptr + b.to(tl.int64) * stride_xs,
                          h * D + tl.program_id(2) * BD, BD, HQ * D, PREP_BITS, GROUP)
        return
    n_split = tl.cdiv(L, _split_span(L, SPLIT, LONG_FROM, LONG_TILES))  # the split kernel's splits of this row
    rd = tl.program_id(2) * BD + tl.arange(0, BD)
    rs = tl.arange(0, BSP)
    base = b.to(tl.int64) * stride_pb + h * stride_ph
    m_run = tl.max(tl.full((BSP,), float("-inf"), dtype=tl.float32), axis=0)
    l_run = tl.sum(tl.zeros((BSP,), dtype=tl.float32), axis=0)
    acc = tl.zeros((BD,), dtype=tl.float32)
    for s0 in range(0, n_split, BSP):
        live = s0 + rs < n_split
        off = base + (s0 + rs) * stride_ps
        # the step's three loads first: nothing orders them behind the maximum's cross-thread reduction
        m = tl.load(pm_ptr + off, mask=live, other=float("-inf"))
        lsp = tl.load(pl_ptr + off, mask=live, other=0.0)
        part = tl.load(po_ptr + off[:, None] * D + rd[None, :], mask=live[:, None], other=0.0)
        m_new = tl.maximum(m_run, tl.max(m, axis=0))  # finite: every live split holds >= 1 token
        alpha = tl.exp2(m_run - m_new)  # 0 on the first step (m_run = -inf)
        w = tl.where(live, tl.exp2(m - m_new), 0.0)
        l_run = l_run * alpha + tl.sum(w * lsp, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * part, axis=0)
        m_run = m_new
    o = _gated(acc / l_run, gate_ptr + b.to(tl.int64) * stride_gb + h * stride_gh + rd, rd < D, HAS_GATE)
    o = o.to(o_ptr.dtype.element_ty)
    tl.store(o_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + rd, o)
    if PREP_BITS > 0:
        _prep_columns(o, xp_ptr + b.to(tl.int64) * stride_xp, xs_ptr + b.to(tl.int64) * stride_xs,
                      h * D + tl.program_id(2) * BD, BD, HQ * D, PREP_BITS, GROUP)


# The split program's launch shape and the merge's come from the launch table (launch_table.py, "attention.*":
# split_tokens, decode_bn, decode_warps_<kind>, decode_stages_<kind>, merge_bsp / merge_bd and merge_throughput,
# long_bn; what each won against is in its doc there). The knobs below are experiments, off unless set (probes).
# split programs per launch to aim for (None: one per split). With a target, each (row, KV head) gets
# P = clamp(target / (B * Hkv), 1, splits) programs that loop over its splits (no arithmetic changes).
DECODE_PROGRAMS = None
# long rows' splits: (FROM, TILES) makes a row of more than FROM tokens split into TILES * split_tokens()-token splits
# (a program a split, "attention.long_bn" tokens a step), so its merge reads TILES times fewer partials; None: one
# split length for every row. A row's split length is a function of its own length, so a row's bits still never
# depend on the batch, but they do on this setting: one per deployment. Not a default until measured in the model
# (lab/NOTES.md).
LONG_SPLIT = None
LONG_SPLIT_TILES = (2, 4, 8)
# the split launch's pipeline stages when long splits are on (None: the table's decode stages): a long split's loop
# of "attention.long_bn"-token steps, its next tile's loads in flight (through shared memory) while one computes;
# no arithmetic
LONG_STAGES = None


def split_tokens() -> int:
    """Tokens a split of the decode attention (launch_table "attention.split_tokens"): with the merge's steps, a
    row's summation order, so one value for every row and batch."""
    return launch_value("attention.split_tokens")


def long_split() -> tuple[int, int] | None:
    """The decode attention's long-row splits (FROM, TILES), or None: DELTASERVE_ATTN_LONG_SPLIT (utils/tuning.py;
    an experiment not yet measured in the model): "auto" (LONG_SPLIT), "off", or "FROMxTILES" (FROM >=
    split_tokens() tokens, TILES one of LONG_SPLIT_TILES)."""
    setting = tuning.get("DELTASERVE_ATTN_LONG_SPLIT")
    chosen = LONG_SPLIT if setting == "auto" else setting
    split = split_tokens()
    if chosen is not None and (chosen[0] < split or chosen[1] not in LONG_SPLIT_TILES):
        where = "triton_paged.LONG_SPLIT" if setting == "auto" else "DELTASERVE_ATTN_LONG_SPLIT"
        raise ValueError(f"{where}: long splits {chosen} need FROM >= the split's tokens ({split}) and TILES one of "
                         f"{LONG_SPLIT_TILES}")
    return chosen


def merge_shape(throughput: bool = False) -> tuple[int, int]:
    """The decode merge's (BSP splits a step, BD columns a program) for a deployment. Both set a row's summation
    order (the tree of a step's sums over BSP, the tile's layout), so the shape is fixed per deployment (from its
    capacity, like the decode GEMV and the DeltaNet step's columns), never per batch; `throughput`: the deployment
    decodes on the tensor-core GEMVs (4+ streams): launch_table "attention.merge_throughput", else
    ("attention.merge_bsp", "attention.merge_bd"): at batch 1 a row's 9 splits at 512 tokens are 128 programs of 8
    columns' blocks, and at 32K its 512 splits 4 steps of 128."""
    if throughput:
        return launch_value("attention.merge_throughput")
    return launch_value("attention.merge_bsp"), launch_value("attention.merge_bd")


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    kv_lens: torch.Tensor, scale: float, max_kv_len: int, out: torch.Tensor | None = None,
    gate: torch.Tensor | None = None, lens_add: int = 0, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None, merge: tuple[int, int] | None = None, settled: bool = False,
    prep: tuple[int, int] | None = None, prep_out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One new token per sequence: q [B, Hq, D] attends to the first kv_lens[b] cached tokens (context + the new
    token, already written). max_kv_len: a host upper bound on kv_lens (sizes the split grid; a CUDA graph can pass
    the model's maximum). gate: None or [B, Hq, D] (any batch/head strides, e.g. qg.view(B, Hq, 2D)[..., D:]),
    returns bf16(bf16(o) * bf16(sigmoid(gate))) then. lens_add: a constant added to every kv_lens[b] in the kernel
    (1 lets the caller pass the context lengths without a `+ 1` launch; max_kv_len bounds the sum). k_scale,
    v_scale: an fp8 cache's scales (kv_fp8.py). merge: the merge's (BSP, BD) (None: merge_shape()), a
    row's summation order: one per deployment (merge_shape). settled: the caller's promise that the lengths, the
    block tables and every cached position but each row's newest were written before the current forward's first
    launch (a launch without PDL), so the split programs may request their K rows before their PDL wait (kv_early();
    the model's decode step; bf16 caches only: sm_90 gives the fp8 program 136 registers that way against 80, one
    8-warp program an SM; never a bit). prep: (bits, group) of the output projection's packed weight: the merge
    launch also writes that decode GEMV's prep of the output rows (quant.triton_gemv.prep_x's format and bits: xp
    [B, Hq * D], xs [B, Hq * D / group], fp32) at a column block of max(BD, group), so the GEMV needs no prep launch
    (merge_prep_supported says which formats); with a host bound <= split_tokens() (no merge launch) prep_x makes it.
    prep_out: the (xp, xs) buffers to write (None: new ones). long_split() (DELTASERVE_ATTN_LONG_SPLIT, LONG_SPLIT):
    rows longer than its FROM tokens take longer splits (fewer partials to merge; their own summation order); not
    with DECODE_PROGRAMS. Returns [B, Hq, D] in q's dtype, with prep (that, (xp, xs))."""
    bsz, hq, d = q.shape
    nb, bs, hkv, dc = k_cache.shape
    if dc != d or hq % hkv or block_tables.shape[0] != bsz or kv_lens.numel() != bsz:
        raise ValueError(f"paged_decode_attention: q {tuple(q.shape)}, cache {tuple(k_cache.shape)}, tables "
                         f"{tuple(block_tables.shape)}, {kv_lens.numel()} lengths disagree")
    if d & (d - 1) or d < 16 or q.stride(-1) != 1 or not k_cache.is_contiguous() or not v_cache.is_contiguous():
        raise ValueError("paged_decode_attention: head_dim must be a power of two >= 16, tensors contiguous")
    if gate is not None and (tuple(gate.shape) != (bsz, hq, d) or gate.stride(-1) != 1):
        raise ValueError(f"paged_decode_attention: gate {tuple(gate.shape)} must be [{bsz}, {hq}, {d}], "
                         "contiguous along D")
    fp8 = check_cache(k_cache, v_cache, k_scale, v_scale, "paged_decode_attention")
    out = torch.empty(bsz, hq, d, dtype=q.dtype, device=q.device) if out is None else out
    if prep is not None:
        if not merge_prep_supported(d, *prep):
            raise ValueError(f"paged_decode_attention: prep {prep} needs bits 4 or 8 and a power-of-two group "
                             f"dividing head_dim {d}")
        if tuple(out.shape) != (bsz, hq, d) or not out.is_contiguous():
            raise ValueError(f"paged_decode_attention: prep needs a contiguous out [{bsz}, {hq}, {d}], found "
                             f"{tuple(out.shape)} strides {out.stride()}")
        xp, xs = prep_out or (torch.empty(bsz, hq * d, dtype=torch.float32, device=q.device),
                              torch.empty(bsz, hq * d // prep[1], dtype=torch.float32, device=q.device))
        for t, width, name in ((xp, hq * d, "xp"), (xs, hq * d // prep[1], "xs")):
            if t.dtype != torch.float32 or tuple(t.shape) != (bsz, width) or not t.is_contiguous():
                raise ValueError(f"paged_decode_attention: prep_out {name} must be contiguous fp32 [{bsz}, {width}] "
                                 f"(the GEMV's layout), found {t.dtype} {tuple(t.shape)} strides {t.stride()}")
    if bsz == 0:
        return out if prep is None else (out, (xp, xs))
    g = hq // hkv
    split = split_tokens()
    bn = launch_value("attention.decode_bn") or (64 if d <= 128 else 32)
    if split % bn:
        raise ValueError(f"paged_decode_attention: attention.decode_bn {bn} must divide attention.split_tokens {split}")
    n_split = max(1, triton.cdiv(max_kv_len, split))
    kind = "fp8" if fp8 else "bf16"
    long = long_split()
    stages = launch_value(f"attention.decode_stages_{kind}") if long is None or LONG_STAGES is None else LONG_STAGES
    po = torch.empty(bsz, hq, n_split, d, dtype=torch.float32, device=q.device)
    pm = torch.empty(bsz, hq, n_split, dtype=torch.float32, device=q.device)
    pl = torch.empty_like(pm)
    gt, (sgb, sgh) = (gate, gate.stride()[:2]) if gate is not None else (out, (0, 0))
    strided = DECODE_PROGRAMS is not None
    if long is not None and strided:
        raise ValueError("paged_decode_attention: long splits (DELTASERVE_ATTN_LONG_SPLIT / LONG_SPLIT) and strided "
                         "split programs (DECODE_PROGRAMS) are alternatives; set one")
    # the grid and the partials stay sized for split-token splits: a long row fills the first of them
    long_args = {} if long is None else {"LONG_FROM": long[0], "LONG_TILES": long[1]}
    # the settled form's launch: its K rows requested before the PDL wait (never a bit). H200, tg64 B=1
    # (lab/NOTES.md): d512 647.8 / 648.0 -> 662.1 / 660.1 tok/s, d32768 558.0 / 557.5 -> 559.2 / 558.3
    early_kv = settled and not fp8 and bn == split and not strided
    per_head = min(n_split, max(1, -(-DECODE_PROGRAMS // (bsz * hkv)))) if strided else n_split
    _decode_split_kernel[(bsz, hkv, per_head)](
        q, k_cache, v_cache, block_tables, kv_lens, po, pm, pl, out, gt, k_scale if fp8 else pm,
        v_scale if fp8 else pm, q.stride(0), q.stride(1), block_tables.stride(0), hkv * d, d, pm.stride(0), pm.stride(1), pm.stride(2),
        out.stride(0), out.stride(1), sgb, sgh, scale * _LOG2E, G=g, GP=max(16, triton.next_power_of_2(g)), D=d,
        BS=bs, SPLIT=split, BN=bn, F32=dot_f32(),
        HAS_GATE=gate is not None, LENS_ADD=lens_add, FP8=fp8, STRIDED=strided,
        num_warps=launch_value(f"attention.decode_warps_{kind}"),
        **pdl_args(out), **({"SETTLED": True} if early_kv else {}),
        **({} if long is None else {**long_args, "LONG_BN": min(launch_value("attention.long_bn"), bn)}),
        **({} if stages is None else {"num_stages": stages}),
    )
    if n_split > 1:  # a host bound <= split means every row was finished by its split program
        bsp, bd = merge or merge_shape()
        bd = min(d, bd if prep is None else max(bd, prep[1]))  # a block of whole groups to prep (BD: no bit)
        xpt, xst = (xp, xs) if prep is not None else (pm, pm)
        _decode_merge_kernel[(bsz, hq, d // bd)](
            po, pm, pl, kv_lens, out, gt, xpt, xst, pm.stride(0), pm.stride(1), pm.stride(2), out.stride(0),
            out.stride(1), sgb, sgh, xpt.stride(0), xst.stride(0), D=d, BD=bd, SPLIT=split, BSP=bsp,
            HAS_GATE=gate is not None, LENS_ADD=lens_add, num_warps=4, **pdl_args(out), **long_args,
            **({} if prep is None else {"HQ": hq, "PREP_BITS": prep[0], "GROUP": prep[1]}),
        )
    elif prep is not None:  # every row finished by its split program: the prep launch (the same code, bits)
        made = prep_x(out.view(bsz, hq * d), *prep)
        if prep_out is None:
            xp, xs = made
        else:
            xp.copy_(made[0])
            xs.copy_(made[1])
    return out if prep is None else (out, (xp, xs))


PREP_GROUP_MIN = 8  # the smallest group the prep's word layout allows (a 4-bit word's 8 codes)


def merge_prep_supported(d: int, bits: int, group: int) -> bool:
    """Can paged_decode_attention(prep=(bits, group)) write the output projection's prep: bits 4 or 8 (the packed
    formats' prep) and a power-of-two group dividing the head size (a merge block owns whole groups of a head)."""
    return bits in (4, 8) and group & (group - 1) == 0 and PREP_GROUP_MIN <= group <= d and d % group == 0


@triton.jit
def _prefill_scores(q, kc_ptr, ks_ptr, table_row, n0, end, q_pos, kvh, rd, stride_cr, stride_ch, qk_scale,
                    BS: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, F32: tl.constexpr, FP8: tl.constexpr):
    """Keys n0 .. n0 + BN of a prefill tile: their scaled, causally masked scores s [BM, BN] (fp32, -inf where
    masked), the V rows' offsets and the keys' validity (for _prefill_accumulate)."""
    pos = n0 + tl.arange(0, BN)
    valid = pos < end
    rows = _kv_rows(table_row, tl.where(valid, pos, -1), BS)
    kv_off = rows[:, None] * stride_cr + kvh * stride_ch + rd[None, :]
    k, ksc = _load_rows(kc_ptr, ks_ptr, kv_off, rows * (stride_cr // D) + kvh, valid, q.dtype, FP8)
    s = mma(q, tl.trans(k), tl.zeros((q.shape[0], BN), dtype=tl.float32), F32)
    if FP8:
        s = s * ksc[None, :]
    s = s * qk_scale
    s = tl.where((pos[None, :] <= q_pos[:, None]) & valid[None, :], s, float("-inf"))
    return s, kv_off, rows, valid


@triton.jit
def _prefill_accumulate(s, vc_ptr, vs_ptr, kv_off, rows, valid, kvh, m_i, l_i, acc, stride_cr,
                        act: tl.constexpr, D: tl.constexpr, F32: tl.constexpr, FP8: tl.constexpr):
    """One key block's online-softmax step: (m, l, acc) updated by scores s and the block's V rows."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # padded query rows see no key at all
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v, vsc = _load_rows(vc_ptr, vs_ptr, kv_off, rows * (stride_cr // D) + kvh, valid, act, FP8)
    pv = p
    if FP8:
        pv = p * vsc[None, :]
    acc = mma(pv.to(v.dtype), v, acc * alpha[:, None], F32)
    return m_new, l_i, acc


@triton.jit
def _prefill_kernel(
    q_ptr, kc_ptr, vc_ptr, table_ptr, cu_ptr, ctx_ptr, o_ptr, ks_ptr, vs_ptr,
    stride_qt, stride_qh, stride_tb, stride_cr, stride_ch, stride_ot, stride_oh, qk_scale,
    G: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, F32: tl.constexpr,
    FP8: tl.constexpr = False, gate_ptr=None, stride_gt=0, stride_gh=0, HAS_GATE: tl.constexpr = False,
):
    # grid (B, cdiv(max new tokens, BM), Hq): BM new tokens of one sequence, one query head; HAS_GATE: the output
    # times sigmoid(gate) (the decode epilogue's _gated, gate [T, Hq, D] read in place). One key block a loop step
    # (two a step, their scores requested before the first block's softmax, measured slower on the H200: 47.98 ->
    # 63.2 us at ctx 0, lab/NOTES.md).
    b = tl.program_id(0)
    tb = tl.program_id(1)
    h = tl.program_id(2)
    start = tl.load(cu_ptr + b)
    n = tl.load(cu_ptr + b + 1) - start
    if tb * BM >= n:
        return
    ctx = tl.load(ctx_ptr + b)
    kvh = h // G
    ri = tb * BM + tl.arange(0, BM)
    i_mask = ri < n
    q_pos = ctx + ri  # cache index of each new token
    rd = tl.arange(0, D)
    q = tl.load(q_ptr + (start + ri).to(tl.int64)[:, None] * stride_qt + h * stride_qh + rd[None, :],
                mask=i_mask[:, None], other=0.0)
    table_row = table_ptr + b.to(tl.int64) * stride_tb
    m_i = tl.full((BM,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BM,), dtype=tl.float32)
    acc = tl.zeros((BM, D), dtype=tl.float32)
    end = ctx + tl.minimum((tb + 1) * BM, n)  # keys beyond the tile's last query are all masked
    for n0 in tl.range(0, end, BN):
        s, kv_off, rows, valid = _prefill_scores(q, kc_ptr, ks_ptr, table_row, n0, end, q_pos, kvh, rd, stride_cr,
                                                 stride_ch, qk_scale, BS, BN, D, F32, FP8)
        m_i, l_i, acc = _prefill_accumulate(s, vc_ptr, vs_ptr, kv_off, rows, valid, kvh, m_i, l_i, acc, stride_cr,
                                            q.dtype, D, F32, FP8)
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    if HAS_GATE:
        o = _gated(o, gate_ptr + (start + ri).to(tl.int64)[:, None] * stride_gt + h * stride_gh + rd[None, :],
                   i_mask[:, None], HAS_GATE)
    tl.store(o_ptr + (start + ri).to(tl.int64)[:, None] * stride_ot + h * stride_oh + rd[None, :],
             o.to(o_ptr.dtype.element_ty), mask=i_mask[:, None])


PREFILL_LAUNCH = None  # (num_warps, num_stages or None) of the prefill kernel; None: prefill_launch's default
@functools.lru_cache(maxsize=None)
def _smem_optin(index: int) -> int:
    return int(getattr(torch.cuda.get_device_properties(index), "shared_memory_per_block_optin", 0))


def _block_smem(device: torch.device | None = None) -> int:
    """Shared memory a block may opt into on a CUDA device (None: the current one; 0 off CUDA: the interpreter),
    read once per device (prefill_launch asks at every launch)."""
    if not torch.cuda.is_available():
        return 0
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        return 0
    return _smem_optin(device.index if device.index is not None else torch.cuda.current_device())


def prefill_launch(d: int, device: torch.device | None = None) -> tuple[int, int | None]:
    """The prefill attention kernel's (num_warps, num_stages (None: Triton's)) for head_dim d: neither changes a
    row's arithmetic (each key block's online-softmax step is the same ops in the same order; GPU test: every
    launch equals the default bit for bit). Past D 128, 8 warps and launch_table "attention.prefill_stages_wide"
    stages where the device has "attention.prefill_stages_smem" bytes of shared memory a block (Triton's stages
    elsewhere); else 4 warps and Triton's stages. PREFILL_LAUNCH, when set, wins (probes)."""
    if PREFILL_LAUNCH:
        return PREFILL_LAUNCH
    if d <= 128:
        return 4, None
    wide = _block_smem(device) >= launch_value("attention.prefill_stages_smem")
    return 8, (launch_value("attention.prefill_stages_wide") if wide else None)


def paged_prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor, context_lens: torch.Tensor, scale: float, max_seqlen: int,
    out: torch.Tensor | None = None, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
    gate: torch.Tensor | None = None, launch: tuple | None = None,
) -> torch.Tensor:
    """Causal attention of the new tokens q [T, Hq, D] (sequence b's are q[cu_seqlens[b]:cu_seqlens[b+1]]) over
    their sequence's cache (context_lens[b] cached tokens before them; the new K/V already written). max_seqlen: a
    host bound on the new tokens per sequence. k_scale, v_scale: an fp8 cache's scales (kv_fp8.py). gate [T, Hq, D]
    (unit stride along D, any other pitches): the output times sigmoid(gate), as paged_decode_attention(gate=)
    makes it (the output rounded to the gate's dtype, times bf16(sigmoid), rounded once). Returns [T, Hq, D] in q's
    dtype (= reference.paged_attention, then the gate). launch: (num_warps, num_stages) instead of
    prefill_launch(D)'s (never a bit)."""
    t, hq, d = q.shape
    nb, bs, hkv, dc = k_cache.shape
    bsz = context_lens.numel()
    if dc != d or hq % hkv or block_tables.shape[0] != bsz or cu_seqlens.numel() != bsz + 1:
        raise ValueError(f"paged_prefill_attention: q {tuple(q.shape)}, cache {tuple(k_cache.shape)}, tables "
                         f"{tuple(block_tables.shape)}, cu_seqlens {cu_seqlens.numel()}, {bsz} contexts disagree")
    if d & (d - 1) or d < 16 or q.stride(-1) != 1 or not k_cache.is_contiguous() or not v_cache.is_contiguous():
        raise ValueError("paged_prefill_attention: head_dim must be a power of two >= 16, tensors contiguous")
    fp8 = check_cache(k_cache, v_cache, k_scale, v_scale, "paged_prefill_attention")
    if gate is not None and (tuple(gate.shape) != (t, hq, d) or gate.stride(-1) != 1):
        raise ValueError(f"paged_prefill_attention: gate must be [{t}, {hq}, {d}] with unit stride along D, found "
                         f"{tuple(gate.shape)}")
    out = torch.empty_like(q) if out is None else out
    if t == 0 or bsz == 0:
        return out
    bm = 64 if d <= 128 else 64
    bn = 64 if d <= 128 else 32
    grid = (bsz, triton.cdiv(max(max_seqlen, 1), bm), hq)
    warps, stages = launch or prefill_launch(d, q.device)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, cu_seqlens, context_lens, out, k_scale if fp8 else out,
        v_scale if fp8 else out, q.stride(0), q.stride(1), block_tables.stride(0), hkv * d, d, out.stride(0), out.stride(1),
        scale * _LOG2E, G=hq // hkv, D=d, BS=bs, BM=bm, BN=bn, F32=dot_f32(), FP8=fp8,
        **({} if gate is None else dict(gate_ptr=gate, stride_gt=gate.stride(0), stride_gh=gate.stride(1),
                                       HAS_GATE=True)),
        **({} if stages is None else {"num_stages": stages}), num_warps=warps,
    )
    return out

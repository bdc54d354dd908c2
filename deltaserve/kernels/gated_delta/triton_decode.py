"""Gated DeltaNet on the GPU: causal conv over the state pool, the fused one-token step, gates, chunked prefill.

Same meaning as the reference path of the model's GatedDeltaNet (`kernels/conv1d.py::causal_conv1d`,
`kernels/gated_delta/reference.py`, `kernels/norm.py::gated_rms_norm`), with the cache layouts of
`model/cache.py`:

  conv pool  [S, C, K-1]      activation dtype, the last K-1 pre-conv inputs of each slot (oldest first)
  ssm pool   [S, Hv, dk, dv]  fp32, S with read-out o = S^T q
  qkv        [T, C]           pre-conv projections, C = 2*Hk*dk + Hv*dv laid out [q heads | k heads | v heads]
A sequence flagged fresh (context length 0) starts from zero conv and recurrent state whatever its slot holds.

Decode (one token per sequence) is the projection GEMV with the conv in its epilogue (`conv_epilogue`, through
`quant.triton_gemv.affine_gemv(..., conv=DecodeConv(...))`: each GEMV program owns its output channels, so it can
shift exactly those channels of the slot's conv state) and then `gdn_decode_step` (L2 norms, gates, delta rule on
the state pool in place, o = S^T q, gated RMSNorm); or `causal_conv` as a launch of its own before the step. The
conv cannot move into the step kernel: the q/k channels of a key head feed Hv/Hk value-head programs, and a fused
conv-state update would race with their reads. Prefill uses `causal_conv` too, then fla-core's chunked kernel
(`gdn_prefill`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..launch_table import value as launch_value
from ..triton_common import code_prescale
from ..triton_sync import arrival_counters, last_arrival
from ..triton_pdl import pdl_args, pdl_open, pdl_wait


@triton.jit
def _conv_kernel(
    x_ptr, w_ptr, state_ptr, cu_ptr, slot_ptr, ctx_ptr, y_ptr,
    C, stride_xt, stride_wc, stride_wk, stride_ss, stride_sc, stride_sk, stride_yt, T, S1, S2,
    KW: tl.constexpr, KWP: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, SECTIONS: tl.constexpr = False,
    STATE: tl.constexpr = True,
):
    # grid (B, cdiv(max new tokens, BT), cdiv(C, BC)). Token i of sequence b reads inputs i-KW+1..i; a negative
    # index reads the conv state (zeros when fresh). Only token block 0 reads the state (BT >= KW-1), and that same
    # program writes the new state after a barrier, so no other program can see a half-updated state.
    # SECTIONS: y is three contiguous [T, width] blocks one after another, channels [0, S1), [S1, S1 + S2) and
    # [S1 + S2, C) (BC divides S1 and S2, so a program's channels lie in one); else y [T, C] with row stride
    # stride_yt. STATE False: the conv state is read, never written (a verify: triton_verify.conv_commit writes it).
    b = tl.program_id(0)
    tb = tl.program_id(1)
    start = tl.load(cu_ptr + b)
    n = tl.load(cu_ptr + b + 1) - start
    if tb * BT >= n:
        return
    slot = tl.load(slot_ptr + b).to(tl.int64)
    keep = tl.load(ctx_ptr + b) != 0  # context 0: a fresh sequence
    rc = tl.program_id(2) * BC + tl.arange(0, BC)
    c_mask = rc < C
    ri = tb * BT + tl.arange(0, BT)
    i_mask = ri < n
    st = state_ptr + slot * stride_ss + rc[None, :] * stride_sc
    acc = tl.zeros((BT, BC), dtype=tl.float32)
    if tb == 0:  # the block whose first KW-1 inputs may come from the state
        for j in tl.static_range(KW):
            src = ri - (KW - 1) + j  # [BT]
            from_x = src >= 0
            xv = tl.load(x_ptr + (start + src).to(tl.int64)[:, None] * stride_xt + rc[None, :],
                         mask=(i_mask & from_x)[:, None] & c_mask[None, :], other=0.0)
            sv = tl.load(st + (src + KW - 1)[:, None] * stride_sk,
                         mask=(i_mask & (src < 0) & keep)[:, None] & c_mask[None, :], other=0.0)
            wj = tl.load(w_ptr + rc * stride_wc + j * stride_wk, mask=c_mask, other=0.0).to(tl.float32)
            acc += tl.where(from_x[:, None], xv.to(tl.float32), sv.to(tl.float32)) * wj[None, :]
    else:  # every input from x (BT >= KW-1): the same products added in the same order, without the state's loads
        row0 = x_ptr + (start + tb * BT - (KW - 1)).to(tl.int64) * stride_xt
        for j in tl.static_range(KW):
            xv = tl.load(row0 + (j + tl.arange(0, BT))[:, None] * stride_xt + rc[None, :],
                         mask=i_mask[:, None] & c_mask[None, :], other=0.0)
            wj = tl.load(w_ptr + rc * stride_wc + j * stride_wk, mask=c_mask, other=0.0).to(tl.float32)
            acc += xv.to(tl.float32) * wj[None, :]
    y = acc / (1.0 + tl.exp(-acc))  # SiLU written as torch's, x / (1 + e^-x)
    if SECTIONS:
        c0 = tl.program_id(2) * BC
        col0 = tl.where(c0 < S1, 0, tl.where(c0 < S1 + S2, S1, S1 + S2))  # the section's first channel
        width = tl.where(c0 < S1, S1, tl.where(c0 < S1 + S2, S2, C - S1 - S2))
        y_at = y_ptr + T.to(tl.int64) * col0 + (start + ri).to(tl.int64)[:, None] * width + (rc - col0)[None, :]
    else:
        y_at = y_ptr + (start + ri).to(tl.int64)[:, None] * stride_yt + rc[None, :]
    if STATE and tb == 0:
        # new state[j] = ([state ; x])[n + j], j < KW-1
        rj = tl.arange(0, KWP)  # KWP = next power of two >= KW-1
        j_mask = rj < KW - 1
        src_j = n - (KW - 1) + rj
        xs = tl.load(x_ptr + (start + src_j).to(tl.int64)[:, None] * stride_xt + rc[None, :],
                     mask=(j_mask & (src_j >= 0))[:, None] & c_mask[None, :], other=0.0)
        ss = tl.load(st + (src_j + KW - 1)[:, None] * stride_sk,
                     mask=(j_mask & (src_j < 0) & keep)[:, None] & c_mask[None, :], other=0.0)
        new = tl.where((src_j >= 0)[:, None], xs.to(state_ptr.dtype.element_ty), ss.to(state_ptr.dtype.element_ty))
        tl.debug_barrier()  # every read of the old state (and of x) in this program is done
        tl.store(st + rj[:, None] * stride_sk, new, mask=j_mask[:, None] & c_mask[None, :])
    # y last: with one token per sequence (a decode step) y may be x itself (out=x), since every read of x is above
    # (the barrier orders them for the state's program, the only one a sequence has then)
    tl.store(y_at, y.to(y_ptr.dtype.element_ty), mask=i_mask[:, None] & c_mask[None, :])


CONV_SECTION_MIN_BLOCK = 8  # the narrowest channel block the sectioned conv runs


def conv_section_block(s1: int, s2: int, widest: int = 64) -> int:
    """The sectioned conv's channel block for sections (s1, s2): the widest power of two <= widest dividing both
    (so a program's channels lie in one section), 0 when that is under CONV_SECTION_MIN_BLOCK."""
    bc = widest
    while bc >= CONV_SECTION_MIN_BLOCK and (s1 <= 0 or s2 <= 0 or s1 % bc or s2 % bc):
        bc //= 2
    return bc if bc >= CONV_SECTION_MIN_BLOCK else 0


def causal_conv(
    x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor, cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor, context_lens: torch.Tensor, max_seqlen: int, out: torch.Tensor | None = None,
    sections: tuple[int, int] | None = None, write_state: bool = True,
):
    """SiLU(causal depthwise conv) for B sequences packed in x [T, C] (cu_seqlens [B+1]); updates conv_pool
    [S, C, K-1] at state_slots [B] in place (context_lens [B] == 0: start from zeros). weight [C, K] (any strides; pass
    conv1d.weight[:, 0, :]). max_seqlen: a host bound on the new tokens per sequence (sizes the grid).
    Returns y [T, C] in x's dtype; computed in fp32 like `kernels/conv1d.py::causal_conv1d`. out may be x itself
    when max_seqlen == 1 (one token per sequence: each program reads all of its x before it writes y).
    sections (S1, S2): instead, y's channels [0, S1), [S1, S1 + S2), [S1 + S2, C) as three contiguous tensors
    [T, S1], [T, S2], [T, C - S1 - S2] (one buffer, no out=): the DeltaNet prefill's q, k, v, which fla-core would
    otherwise copy to make contiguous (its input guard: 3 copies a layer). The same values as y's column slices.
    write_state False: conv_pool is only read (a speculative verify's rows: triton_verify.conv_commit writes the
    window of the rows kept); the same outputs."""
    t, c = x.shape
    kw = weight.shape[1]
    if weight.shape[0] != c or tuple(conv_pool.shape[1:]) != (c, kw - 1):
        raise ValueError(f"causal_conv: x [T, {c}], weight {tuple(weight.shape)}, conv pool "
                         f"{tuple(conv_pool.shape)}: expected weight [{c}, K] and pool [S, {c}, K-1]")
    if not 2 <= kw <= 16:
        raise ValueError(f"causal_conv: kernel width {kw} outside 2..16 (Qwen3.5 uses 4)")
    if x.stride(-1) != 1:
        raise ValueError("causal_conv: x must be contiguous along channels")
    bc = 256 if max_seqlen == 1 else 64
    if sections is not None:
        s1, s2 = sections
        bc = conv_section_block(s1, s2, bc)
        if out is not None or not bc or s1 + s2 >= c:
            raise ValueError(f"causal_conv: sections {sections} of C = {c} must be positive multiples of "
                             f"{CONV_SECTION_MIN_BLOCK} leaving a third channel range, without out=")
        buf = torch.empty(t * c, dtype=x.dtype, device=x.device)
        y = buf  # written by sections; split below
    else:
        s1 = s2 = 0
        y = torch.empty_like(x) if out is None else out
    b = state_slots.numel()
    if b and t:
        bt = 16 if max_seqlen > 1 else 4  # decode: one token per sequence (16 x 64 prefill tiles: larger ones
        # were slower on the H200, 13.2 against 15.2-27.3 us at 512 tokens; lab/NOTES.md)
        kwp = triton.next_power_of_2(kw - 1)
        bt = max(bt, kwp)
        grid = (b, triton.cdiv(max(max_seqlen, 1), bt), triton.cdiv(c, bc))
        _conv_kernel[grid](
            x, weight, conv_pool, cu_seqlens, state_slots, context_lens, y,
            c, x.stride(0), weight.stride(0), weight.stride(1), conv_pool.stride(0), conv_pool.stride(1),
            conv_pool.stride(2), c if sections is not None else y.stride(0), t, s1, s2, KW=kw, KWP=kwp, BT=bt, BC=bc,
            SECTIONS=sections is not None, num_warps=4, **({} if write_state else {"STATE": False}),
        )
    if sections is None:
        return y
    widths = (s1, s2, c - s1 - s2)
    return tuple(part.view(t, w) for part, w in zip(buf.split([t * w for w in widths]), widths))


@triton.jit
def conv_epilogue(out_ptr, acc, rn, n_mask, m, M, stride_om, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C,
                  stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk, KCONV: tl.constexpr):
    """The decode conv in a GEMV epilogue (quant.triton_gemv, CONV=True), for row m (one new token of sequence
    m) and the program's features rn; acc [BN, X] fp32 is the row's accumulator (summed over axis 1). rn < C are
    conv channels. y = the projection rounded to the activation dtype (what the plain GEMV stores); out =
    SiLU(sum_j w[c, j] * [state ; y]_j) accumulated in fp32 in the order j = 0 .. KCONV-1 from zero, exactly as
    _conv_kernel; the pool slot's [C, KCONV-1] window shifts by one (oldest dropped, y appended). This program
    owns its features, so no other program touches these channels of the slot. Context 0 (fresh): the old state
    reads as zeros. Features >= C are stored plain. Rows m >= M (padding of the row block) neither store nor
    update the pool. The inputs come from conv_inputs (a caller may request them earlier: see there)."""
    conv_apply(out_ptr, acc, rn, n_mask, m, M, stride_om, pool_ptr, C,
               conv_inputs(rn, n_mask, m, M, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C, stride_cwc, stride_cwk,
                           stride_ps, stride_pc, stride_pk, KCONV), stride_pk, KCONV)


@triton.jit
def conv_inputs(rn, n_mask, m, M, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C, stride_cwc, stride_cwk, stride_ps,
                stride_pc, stride_pk, KCONV: tl.constexpr):
    """What conv_apply reads for row m's features rn: (the slot's window pointers, the window's KCONV - 1 values
    (zeros when fresh), the KCONV conv weights in fp32). All of it is constant (the weights), step metadata (slots,
    context lengths: set before the forward) or the pool slot's channels, which only this conv writes, in earlier
    forwards: so a GEMV launched with PDL may request it before its wait (triton_pdl's protocol)."""
    mm = tl.minimum(m, M - 1)
    slot = tl.load(slot_ptr + mm).to(tl.int64)
    keep = tl.load(ctx_ptr + mm) != 0
    c_mask = n_mask & (rn < C)
    st = pool_ptr + slot * stride_ps + rn.to(tl.int64) * stride_pc
    svs = ()
    for j in tl.static_range(KCONV - 1):
        svs = svs + (tl.load(st + j * stride_pk, mask=c_mask & keep, other=0.0),)
    ws = ()
    for j in tl.static_range(KCONV):
        ws = ws + (tl.load(cw_ptr + rn * stride_cwc + j * stride_cwk, mask=c_mask, other=0.0).to(tl.float32),)
    return st, svs, ws


@triton.jit
def conv_apply(out_ptr, acc, rn, n_mask, m, M, stride_om, pool_ptr, C, inputs, stride_pk, KCONV: tl.constexpr):
    """conv_epilogue's arithmetic and stores on conv_inputs' values."""
    st, svs, ws = inputs
    act = out_ptr.dtype.element_ty
    y = tl.sum(acc, axis=1).to(act)
    live = m < M
    c_mask = n_mask & (rn < C)
    conv = tl.zeros(y.shape, dtype=tl.float32)
    for j in tl.static_range(KCONV - 1):
        conv += svs[j].to(tl.float32) * ws[j]
    conv += y.to(tl.float32) * ws[KCONV - 1]
    conv = conv / (1.0 + tl.exp(-conv))  # SiLU written as torch's (and _conv_kernel's), x / (1 + e^-x)
    res = tl.where(rn < C, conv.to(act), y)
    tl.store(out_ptr + m.to(tl.int64) * stride_om + rn, res, mask=n_mask & live)
    # shift the window: new[j] = old[j + 1] (zeros when fresh), new[KCONV-2] = y; every read was done first
    upd = c_mask & live
    tl.debug_barrier()
    for j in tl.static_range(KCONV - 2):
        tl.store(st + j * stride_pk, svs[j + 1], mask=upd)
    tl.store(st + (KCONV - 2) * stride_pk, y.to(pool_ptr.dtype.element_ty), mask=upd)


class DecodeConv(NamedTuple):
    """The DeltaNet decode conv to run in a GEMV's epilogue (one token per row of x = per sequence): output
    features < channels are conv channels. weight [C, K] (any strides; conv1d.weight[:, 0, :]); pool [S, C, K-1]
    in the activation dtype, updated in place at state_slots [M]; context_lens [M] == 0 starts from zeros."""
    weight: torch.Tensor
    pool: torch.Tensor
    state_slots: torch.Tensor
    context_lens: torch.Tensor
    channels: int


def check_decode_conv(conv: DecodeConv, m: int, n: int, dtype) -> int:
    """The conv's kernel width K after checking it against m rows, n GEMV features and the activation dtype."""
    c = conv.channels
    kw = conv.weight.shape[-1]
    if conv.weight.dim() != 2 or conv.weight.shape[0] != c or tuple(conv.pool.shape[1:]) != (c, kw - 1):
        raise ValueError(f"gemv conv: weight {tuple(conv.weight.shape)}, pool {tuple(conv.pool.shape)}: expected "
                         f"weight [{c}, K] and pool [S, {c}, K-1]")
    if not 2 <= kw <= 16 or not 0 < c <= n:
        raise ValueError(f"gemv conv: kernel width {kw} outside 2..16 or {c} channels outside 1..{n} features")
    if conv.state_slots.numel() != m or conv.context_lens.numel() != m:
        raise ValueError(f"gemv conv: {m} rows (one token per sequence) but {conv.state_slots.numel()} slots, "
                         f"{conv.context_lens.numel()} context lengths")
    if conv.pool.dtype != dtype:
        raise ValueError(f"gemv conv: pool dtype {conv.pool.dtype} != activation dtype {dtype}")
    return kw


@triton.jit
def _softplus(x):
    # torch's softplus (beta 1, threshold 20)
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def _state_columns(ssm_ptr, slot_ptr, ctx_ptr, bi, h, rv, stride_ss, stride_sh, stride_sk, DK: tl.constexpr):
    """(S [DK, len(rv)] fp32, its addresses): columns rv of state[slot of sequence bi, h], zeros for a fresh
    sequence (context 0). May run before the kernel's PDL wait: the slot index and context length are the step's
    metadata, set before the step's first kernel, and the state is written only by this kernel, in earlier steps
    (triton_pdl: state a kernel alone owns)."""
    slot = tl.load(slot_ptr + bi).to(tl.int64)
    keep = tl.load(ctx_ptr + bi) != 0
    rk = tl.arange(0, DK)
    sp = ssm_ptr + slot * stride_ss + h * stride_sh + rk[:, None] * stride_sk + rv[None, :]
    return tl.load(sp, mask=(rk[:, None] >= 0) & keep, other=0.0), sp


@triton.jit
def delta_rule_update(qkv_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, s, bi, h, rv, stride_qt, stride_at, stride_bt,
                      key_dim, scale, R: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr):
    """The delta rule of one token (row bi of qkv/a/b) on state columns s [DK, len(rv)] (fp32) of value head h:
    (the updated columns, the token's L2-normed and scaled q [DK]); o = sum(s * q[:, None], axis=0). Shared by the
    decode step and the verify kernels (triton_verify.py), so a token's state and output are one arithmetic."""
    kh = h // R
    rk = tl.arange(0, DK)
    row = qkv_ptr + bi.to(tl.int64) * stride_qt
    q = tl.load(row + kh * DK + rk).to(tl.float32)
    k = tl.load(row + key_dim + kh * DK + rk).to(tl.float32)
    v = tl.load(row + 2 * key_dim + h * DV + rv).to(tl.float32)
    q = q * (1.0 / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)) * scale
    k = k * (1.0 / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6))
    a = tl.load(a_ptr + bi.to(tl.int64) * stride_at + h).to(tl.float32)
    bb = tl.load(b_ptr + bi.to(tl.int64) * stride_bt + h).to(tl.float32)
    g = -tl.exp(tl.load(alog_ptr + h).to(tl.float32)) * _softplus(a + tl.load(dtb_ptr + h).to(tl.float32))
    beta = tl.sigmoid(bb)
    s = s * tl.exp(g)
    mem = tl.sum(s * k[:, None], axis=0)  # S^T k
    u = beta * (v - mem)
    s = s + k[:, None] * u[None, :]
    return s, q


@triton.jit
def _gated_norm_row(o_row, of, z_row, nw_ptr, inv, rv, act):
    """The reference's gated RMSNorm rounding points on o (act dtype values of), given 1 / rms: normed -> act,
    * w -> act, * SiLU(z) -> act, stored at o_row + rv. Returns the stored values (act)."""
    y = (of * inv).to(act)
    y = (tl.load(nw_ptr + rv).to(act).to(tl.float32) * y.to(tl.float32)).to(act).to(tl.float32)
    z = tl.load(z_row + rv).to(tl.float32)
    out = (y * (z / (1.0 + tl.exp(-z)))).to(act)
    tl.store(o_row + rv, out)
    return out


@triton.jit
def _prep_head(y, xp_row, xs_row, h, ra, DV: tl.constexpr, K: tl.constexpr, BITS: tl.constexpr,
               GROUP: tl.constexpr):
    """The out projection GEMV's prep (quant.triton_gemv.prep_row's layout) of this head's DV outputs y (the act
    values just stored, columns h * DV + ra of a row of K): xp[i * K/PACK + j] = x[j * PACK + i] * 2^-(BITS * (i %
    PACK/2)) (exact, so the same bits as prep_row's) and xs, the sums of the head's DV / GROUP groups (fp32, this
    tile's fixed order; prep_row adds a group in its own fixed order, so xs may differ from it in the last bit).
    Needs DV % GROUP == 0 (so DV % PACK == 0)."""
    PACK: tl.constexpr = 32 // BITS
    KW: tl.constexpr = K // PACK
    G: tl.constexpr = DV // GROUP
    yf = y.to(tl.float32)
    i = ra % PACK  # h * DV is a multiple of PACK: the code index of column h * DV + ra
    tl.store(xp_row + i * KW + (h * DV + ra) // PACK, yf * code_prescale(i, BITS))
    tl.store(xs_row + h * G + tl.arange(0, G), tl.sum(tl.reshape(yf, (G, GROUP)), axis=1))


# What a launch of _step_rows_kernel does (a runtime argument: every mode runs the SAME compiled kernel, so a token's
# state update is one machine code whether decoded, verified or committed; per-mode constexprs would let the compiler
# contract the delta rule's multiply-adds differently, and a verified token's state would differ in its last bits
# from the decode step's, as measured on the H100 before the modes shared one kernel)
STEP_DECODE, STEP_VERIFY, STEP_COMMIT = 0, 1, 2


@triton.jit(do_not_specialize=["mode", "cu_ptr", "keep_ptr"])
def _step_rows_kernel(
    qkv_ptr, z_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, nw_ptr, ssm_ptr, cu_ptr, keep_ptr, slot_ptr, ctx_ptr, o_ptr,
    ss_ptr, cnt_ptr, xp_ptr, xs_ptr,
    stride_qt, stride_zt, stride_at, stride_bt, stride_ss, stride_sh,
    stride_sk: tl.constexpr,  # the state's dk stride, a constant: loads and stores at immediate offsets
    stride_ot, stride_pt, stride_st, stride_sst,
    mode, key_dim, scale, eps,
    HV: tl.constexpr, R: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
    PREP_BITS: tl.constexpr = 0, PREP_GROUP: tl.constexpr = 64, PDL: tl.constexpr = False,
):
    # grid (B, Hv, DV / BV). Program (b, h, j) owns columns [j BV, (j+1) BV) of state[slot b, h] ([DK, BV] fp32, read
    # once) and walks sequence b's rows in order, the state in registers:
    #   STEP_DECODE  row b alone; the state written after it (gdn_decode_step)
    #   STEP_VERIFY  rows cu[b] .. cu[b+1] - 1; the state written only when there is one row (triton_verify)
    #   STEP_COMMIT  the first min(keep[b], n) of those rows; the state written after them when n > 1 and keep > 0
    #                (the outputs go to scratch: the verify wrote the real ones)
    # Each row's output: BV == DV, the head form: the gated RMSNorm in the program; else the split form: each row's
    # act-rounded slice and partial sum of squares ss[row, h, j], then the head's last-arrival program
    # (triton_sync.last_arrival) sums the DV / BV partials in order j = 0, 1, .. and normalises, gates and rewrites
    # every row of the sequence. PREP_BITS > 0: also the out projection's prep of each row (_prep_head).
    pdl_open(PDL)
    bi = tl.program_id(0)
    h = tl.program_id(1)
    j = tl.program_id(2)
    NS: tl.constexpr = DV // BV
    start = bi.to(tl.int64)
    n = start * 0 + 1
    if mode != 0:
        start = tl.load(cu_ptr + bi)
        n = tl.load(cu_ptr + bi + 1) - start
    rows = n
    if mode == 2:
        rows = tl.minimum(tl.load(keep_ptr + bi), n)
    store = ((mode != 2) & (n == 1)) | ((mode == 2) & (n > 1) & (rows > 0))
    rv = j * BV + tl.arange(0, BV)
    # the state read before the PDL wait (its HBM read overlaps the predecessor's tail): the slot and context are
    # the step's metadata, set before its first kernel, and the state is written only by this kernel, in earlier
    # launches (triton_pdl: state a kernel alone owns)
    s, sp = _state_columns(ssm_ptr, slot_ptr, ctx_ptr, bi, h, rv, stride_ss, stride_sh, stride_sk, DK)
    pdl_wait(PDL)  # every input (q/k/v, gates, z) comes from the kernels just before
    act = o_ptr.dtype.element_ty
    for i in range(rows):
        row = (start + i).to(tl.int64)
        s, q = delta_rule_update(qkv_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, s, row, h, rv, stride_qt, stride_at,
                                 stride_bt, key_dim, scale, R, DK, DV)
        o = tl.sum(s * q[:, None], axis=0)  # S^T q
        o_row = o_ptr + row * stride_ot + h * DV
        if NS == 1:
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
    if store:
        tl.store(sp, s)
    if NS > 1:
        if last_arrival(cnt_ptr + bi * HV + h, NS):
            ra = tl.arange(0, DV)
            for i in range(rows):
                row = (start + i).to(tl.int64)
                o_row = o_ptr + row * stride_ot + h * DV
                parts = tl.load(ss_ptr + row * stride_sst + h * NS + tl.arange(0, NS), cache_modifier=".cg")
                inv = 1.0 / tl.sqrt(tl.sum(parts, axis=0) / DV + eps)
                full = tl.load(o_row + ra, cache_modifier=".cg").to(tl.float32)
                y = _gated_norm_row(o_row, full, z_ptr + row * stride_zt + h * DV, nw_ptr, inv, ra, act)
                if PREP_BITS > 0:
                    _prep_head(y, xp_ptr + row * stride_pt, xs_ptr + row * stride_st, h, ra, DV, HV * DV, PREP_BITS,
                               PREP_GROUP)


def check_step_rows(what: str, qkv, z, a, b, norm_weight, ssm_pool, num_k_heads: int, prep,
                    dv_block: int | None) -> None:
    """The arguments every mode of the step shares, checked (a ValueError naming `what`): qkv [T, C] with C = 2 Hk
    dk + Hv dv, z [T, Hv*dv], a / b [T, Hv], each contiguous along its last axis; norm_weight [dv]; the fp32 pool
    [S, Hv, dk, dv]; the prep's format; dv_block a power of two dividing dv (or None / >= dv: a head)."""
    t, c = qkv.shape
    _, hv, dk, dv = ssm_pool.shape
    key_dim = num_k_heads * dk
    if c != 2 * key_dim + hv * dv or hv % num_k_heads:
        raise ValueError(f"{what}: qkv has {c} channels; with Hk={num_k_heads}, pool {tuple(ssm_pool.shape)} expected "
                         f"{2 * key_dim + hv * dv} and Hv divisible by Hk")
    if z.shape != (t, hv * dv) or a.shape != (t, hv) or b.shape != (t, hv) or norm_weight.numel() != dv:
        raise ValueError(f"{what}: z {tuple(z.shape)}, a {tuple(a.shape)}, b {tuple(b.shape)}, norm "
                         f"{tuple(norm_weight.shape)} do not fit [{t}, {hv * dv}], [{t}, {hv}], dv={dv}")
    if ssm_pool.dtype != torch.float32 or ssm_pool.stride(-1) != 1:
        raise ValueError(f"{what}: the ssm pool must be fp32 with a contiguous dv axis")
    for name, x in (("qkv", qkv), ("z", z), ("a", a), ("b", b)):
        if x.stride(-1) != 1:
            raise ValueError(f"{what}: {name} must be contiguous along its last axis")
    if prep is not None and not prep_supported(dv, *prep):
        raise ValueError(f"{what}: prep {prep} needs bits 4 or 8 and dv = {dv} a multiple of the group")
    if dv_block is not None and dv_block < dv and (dv % dv_block or dv_block & (dv_block - 1)):
        raise ValueError(f"{what}: dv_block {dv_block} must be a power of two dividing dv = {dv}")


def launch_step_rows(mode: int, qkv, z, a, b, a_log, dt_bias, norm_weight, ssm_pool, cu_seqlens, keep, state_slots,
                     context_lens, num_k_heads: int, eps: float, o, prep, dv_block: int | None,
                     num_warps: int | None) -> tuple | None:
    """Launch _step_rows_kernel in `mode` (STEP_*) over state_slots.numel() sequences: o [T, Hv*dv] (the rows'
    outputs), prep (bits, group) or None. Returns the prep's (xp, xs) [T, Hv*dv], [T, Hv*dv / group] when prep.
    cu_seqlens / keep: device tensors (STEP_DECODE reads neither). dv_block: state columns a program (None or >= dv:
    a head); num_warps: None for the step's default. The shape and warps are part of a row's bits. The arguments
    are the caller's to check (check_step_rows)."""
    t = qkv.shape[0]
    nseq = state_slots.numel()
    _, hv, dk, dv = ssm_pool.shape
    bits, group = prep or (0, 64)
    xp = torch.empty(t, hv * dv, dtype=torch.float32, device=o.device) if prep else o
    xs = torch.empty(t, hv * dv // group, dtype=torch.float32, device=o.device) if prep else o
    if nseq == 0 or t == 0:
        return (xp, xs) if prep else None
    bv = dv if dv_block is None or dv_block >= dv else dv_block
    ns = dv // bv
    ss = torch.empty(t, hv * ns, dtype=torch.float32, device=o.device) if ns > 1 else o
    counters = arrival_counters(o.device, nseq * hv) if ns > 1 else o
    # one signature for every mode (the index tensors' dtypes are part of it; .to is free when already int64)
    cu_seqlens, keep, state_slots, context_lens = (x.to(torch.int64) for x in (cu_seqlens, keep, state_slots,
                                                                                context_lens))
    _step_rows_kernel[(nseq, hv, ns)](
        qkv, z, a, b, a_log, dt_bias, norm_weight, ssm_pool, cu_seqlens, keep, state_slots, context_lens, o, ss,
        counters, xp, xs,
        qkv.stride(0), z.stride(0), a.stride(0), b.stride(0), ssm_pool.stride(0), ssm_pool.stride(1),
        ssm_pool.stride(2), o.stride(0), xp.stride(0), xs.stride(0), ss.stride(0) if ns > 1 else 0,
        mode, num_k_heads * dk, dk ** -0.5, eps,
        HV=hv, R=hv // num_k_heads, DK=dk, DV=dv, BV=bv, PREP_BITS=bits, PREP_GROUP=group,
        num_warps=num_warps or (4 if ns > 1 else launch_value("deltanet.head_warps")), **pdl_args(o),
        **step_maxnreg(bv),
    )
    return (xp, xs) if prep else None


def step_maxnreg(bv: int) -> dict:
    """The step's register cap for programs of bv state columns (launch_table "deltanet.step_maxnreg": (columns,
    cap) pairs; none: the compiler's choice), as launch keywords. The same compiled arithmetic (ptxas allocates the
    registers), the same kernel for every mode, so a cap changes no row's bits relative to the other modes."""
    cap = dict(launch_value("deltanet.step_maxnreg")).get(bv)
    return {} if cap is None else {"maxnreg": cap}


# State columns per program of the decode step: launch_table "deltanet.step_dv_block" (and its throughput
# deployment's "deltanet.step_dv_block_throughput"), one shape for every batch size (the dk sums follow the
# program's layout, so the shape is part of a row's bits); what each won against is in the table's docs.
DV_DEFAULT = "default"  # a step's dv_block argument when it is not given: step_dv_block() (the batch-1 deployment's)


def resolve_dv_block(dv_block: int | str | None) -> int | None:
    return step_dv_block() if dv_block == DV_DEFAULT else dv_block


def gdn_decode_step(
    qkv_conv: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor,
    dt_bias: torch.Tensor, norm_weight: torch.Tensor, ssm_pool: torch.Tensor, state_slots: torch.Tensor,
    context_lens: torch.Tensor, num_k_heads: int, eps: float, out: torch.Tensor | None = None,
    dv_block: int | str | None = DV_DEFAULT, num_warps: int | None = None, prep: tuple[int, int] | None = None,
):
    """One DeltaNet token for each of B sequences, after `causal_conv`.

    qkv_conv [B, C] conv output (activation dtype); z [B, Hv*dv]; a, b [B, Hv] (in_proj_a/b outputs); a_log,
    dt_bias [Hv]; norm_weight [dv]; ssm_pool [S, Hv, dk, dv] fp32, updated in place at state_slots [B] (context_lens
    [B] == 0: start from zero state). Returns the gated-normed output [B, Hv*dv] (activation dtype), ready for out_proj.
    dv_block: state columns per program (B * Hv * dv / dv_block programs, the norm finished by each head's last
    arrival; DV_DEFAULT: step_dv_block()); None: one program per head (B * Hv programs; 32 at B = 1, 4.0 us on the
    H200 for 4 MB of state).
    num_warps: per program (None: 4 split, launch_table "deltanet.head_warps" per head); a launch choice for sweeps,
    fixed like dv_block, since the dk sums follow the program's layout.
    prep: (bits, group) of the out projection's q4/q8 weight: the step also writes that decode GEMV's prep of its
    output (quant.triton_gemv.prep_row's format: xp [B, Hv*dv] fp32, xs [B, Hv*dv / group] fp32) at each head's
    last arrival, and returns (o, (xp, xs)) so the GEMV needs no prep launch (prep_supported says which formats).
    """
    dv_block = resolve_dv_block(dv_block)
    check_step_rows("gdn_decode_step", qkv_conv, z, a, b, norm_weight, ssm_pool, num_k_heads, prep, dv_block)
    _, hv, _, dv = ssm_pool.shape
    o = torch.empty(qkv_conv.shape[0], hv * dv, dtype=qkv_conv.dtype, device=qkv_conv.device) if out is None else out
    made = launch_step_rows(STEP_DECODE, qkv_conv, z, a, b, a_log, dt_bias, norm_weight, ssm_pool, state_slots,
                            state_slots, state_slots, context_lens, num_k_heads, eps, o, prep, dv_block, num_warps)
    return (o, made) if prep else o


def step_dv_block(throughput: bool = False) -> int:
    """The decode step's state columns a program in the model (launch_table "deltanet.step_dv_block", or
    "deltanet.step_dv_block_throughput" when `throughput`: the deployment decodes on the tensor-core GEMVs,
    KernelPlan.throughput). The shape is part of a row's bits (the dk sums follow it), so it is fixed per
    deployment, never per batch."""
    return launch_value("deltanet.step_dv_block_throughput" if throughput else "deltanet.step_dv_block")


def prep_supported(dv: int, bits: int, group: int) -> bool:
    """Can gdn_decode_step(prep=(bits, group)) write the out projection's prep: bits 4 or 8 (the packed formats'
    prep), a head's dv a multiple of the group (each head's last arrival owns whole groups; dv and the group are
    powers of two in every Qwen3.5 config and checkpoint format, as the kernel's aranges need)."""
    return bits in (4, 8) and dv % group == 0 and dv & (dv - 1) == 0 and group & (group - 1) == 0


@triton.jit
def _gates_kernel(a_ptr, b_ptr, alog_ptr, dtb_ptr, g_ptr, beta_ptr, T, HV, stride_at, stride_bt,
                  BT: tl.constexpr, BH: tl.constexpr):
    rt = tl.program_id(0) * BT + tl.arange(0, BT)
    rh = tl.arange(0, BH)
    m = (rt < T)[:, None] & (rh < HV)[None, :]
    a = tl.load(a_ptr + rt.to(tl.int64)[:, None] * stride_at + rh[None, :], mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rt.to(tl.int64)[:, None] * stride_bt + rh[None, :], mask=m, other=0.0).to(tl.float32)
    alog = tl.load(alog_ptr + rh, mask=rh < HV, other=0.0).to(tl.float32)
    dtb = tl.load(dtb_ptr + rh, mask=rh < HV, other=0.0).to(tl.float32)
    g = -tl.exp(alog)[None, :] * _softplus(a + dtb[None, :])
    off = rt.to(tl.int64)[:, None] * HV + rh[None, :]
    tl.store(g_ptr + off, g, mask=m)
    tl.store(beta_ptr + off, tl.sigmoid(b), mask=m)


def gdn_gates(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b): fp32 [T, Hv] each (`reference.gdn_gates`)."""
    t, hv = a.shape
    if b.shape != a.shape or a_log.numel() != hv or dt_bias.numel() != hv:
        raise ValueError(f"gdn_gates: a {tuple(a.shape)}, b {tuple(b.shape)}, A_log {tuple(a_log.shape)}, "
                         f"dt_bias {tuple(dt_bias.shape)} disagree")
    g = torch.empty(t, hv, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    if t:
        bh = triton.next_power_of_2(hv)
        bt = max(1, 1024 // bh)
        _gates_kernel[(triton.cdiv(t, bt),)](a, b, a_log, dt_bias, g, beta, t, hv, a.stride(0), b.stride(0),
                                            BT=bt, BH=bh, num_warps=4)
    return g, beta


@triton.jit
def _initial_states_kernel(pool_ptr, slot_ptr, ctx_ptr, out_ptr, N, stride_ps, BLOCK: tl.constexpr):
    # grid (B, cdiv(N, BLOCK)): out[b] = pool[slot[b]] where context_lens[b] != 0, else zeros; N = Hv dk dv elements
    # a state (each pool slot contiguous), copied as they are
    b = tl.program_id(0)
    r = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = r < N
    slot = tl.load(slot_ptr + b).to(tl.int64)
    keep = tl.load(ctx_ptr + b) != 0
    h = tl.load(pool_ptr + slot * stride_ps + r, mask=mask & keep, other=0.0)
    tl.store(out_ptr + b.to(tl.int64) * N + r, h, mask=mask)


def initial_states(ssm_pool: torch.Tensor, state_slots: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
    """The prefill's initial states [B, Hv, dk, dv]: ssm_pool[state_slots[b]] where context_lens[b] != 0, else zeros
    (a fresh sequence, whatever its slot holds). One launch where the pool's slots are contiguous (the cache's
    layout), instead of torch's index_select, comparison, scalar fill and where (four launches, ~11 us a DeltaNet
    layer of a 512-token prefill on the H200: lab/NOTES.md; 2.1 us in one). The same values either way (a copy or
    a zero)."""
    n = state_slots.numel()
    if not (ssm_pool.is_contiguous() and n):
        h0 = ssm_pool.index_select(0, state_slots.to(torch.int64))
        return torch.where((context_lens != 0).view(n, 1, 1, 1), h0, torch.zeros((), dtype=h0.dtype, device=h0.device))
    per = ssm_pool[0].numel()
    out = torch.empty((n, *ssm_pool.shape[1:]), dtype=ssm_pool.dtype, device=ssm_pool.device)
    block = launch_value("deltanet.initial_states_block")
    _initial_states_kernel[(n, triton.cdiv(per, block))](
        ssm_pool, state_slots, context_lens, out, per, ssm_pool.stride(0), BLOCK=block, num_warps=4)
    return out


FLA_CHUNK = 64  # fla-core's chunk size for the gated delta rule (chunk_gated_delta_rule's default)


class ChunkIndex(NamedTuple):
    """fla-core's varlen bookkeeping of one batch's sequences, made by fla's own helpers (prefill_chunk_index).
    gdn_prefill hands fla the indices; the lens and offsets are held only so that the tensors fla looks up again
    stay alive."""

    lens: torch.Tensor  # [B]
    indices: torch.Tensor  # [NC, 2]: (sequence, chunk within it) of each chunk
    offsets: torch.Tensor  # [B + 1]: each sequence's first chunk


def prefill_chunk_index(cu_seqlens: torch.Tensor, cu_seqlens_cpu: torch.Tensor | None = None) -> ChunkIndex:
    """The chunk index gdn_prefill hands fla for sequences cu_seqlens (int64 [B + 1] on the device; cu_seqlens_cpu
    its host copy, which spares a device -> host copy). Hold it for as long as anything may read it: fla memoises
    these tensors by argument identity in a cache of its last few calls only, so a CUDA graph captured on a cached
    entry would read freed memory once later calls evicted it (a prefill graph replayed after prompts of other
    lengths: an illegal address). gdn_prefill keeps one in its batch's memo (ForwardBatch.memo), and a captured
    prefill graph keeps its batch. fla's forward looks the offsets (and their lens) up again by the same
    arguments: a hit returns these tensors, a miss inside a capture computes them with captured device ops (both
    safe)."""
    try:
        from fla.ops.utils.index import prepare_chunk_indices, prepare_chunk_offsets, prepare_lens
    except ImportError as exc:  # fla-core travels as a wheel (wheels.txt)
        raise ImportError("gdn_prefill needs fla-core 0.6.0 (see wheels.txt)") from exc
    if cu_seqlens.dtype != torch.int64:
        raise ValueError(f"prefill_chunk_index: cu_seqlens must be int64 (fla looks its index up by this tensor), "
                         f"found {cu_seqlens.dtype}")
    # positional arguments, as fla's forward passes them (its cache compares the argument lists)
    return ChunkIndex(prepare_lens(cu_seqlens),
                      prepare_chunk_indices(cu_seqlens, FLA_CHUNK, cu_seqlens_cpu=cu_seqlens_cpu),
                      prepare_chunk_offsets(cu_seqlens, FLA_CHUNK))


def gdn_prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    cu_seqlens: torch.Tensor, ssm_pool: torch.Tensor, state_slots: torch.Tensor, context_lens: torch.Tensor,
    scale: float, cu_seqlens_cpu: torch.Tensor | None = None, memo: dict | None = None,
) -> torch.Tensor:
    """Chunked gated delta rule over B packed sequences with fla-core's `chunk_gated_delta_rule` (varlen).

    q, k [T, Hk, dk] and v [T, Hv, dv]: conv outputs, NOT yet L2-normalised (done in fp32 inside fla, eps 1e-6, as
    the reference's l2norm); g, beta [T, Hv] fp32 (gdn_gates); cu_seqlens [B+1]. Initial states are gathered from
    ssm_pool [S, Hv, dk, dv] at state_slots (zeros where context_lens == 0) and the final states written back.
    Returns o [T, Hv, dv] in v's dtype (before the gated norm). Same meaning as `reference.gated_delta_chunked`
    per sequence with the L2 norms applied first. memo: a dict that lives as long as these sequences' batch
    (ForwardBatch.memo), where fla's chunk index is made once and kept (required under CUDA-graph capture: see
    prefill_chunk_index); None: made for this call.
    """
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as exc:  # fla-core travels as a wheel (wheels.txt)
        raise ImportError("gdn_prefill needs fla-core 0.6.0 (see wheels.txt)") from exc
    n = state_slots.numel()
    if cu_seqlens.numel() != n + 1 or context_lens.numel() != n:
        raise ValueError(f"gdn_prefill: {n} state slots, {cu_seqlens.numel()} cu_seqlens, "
                         f"{context_lens.numel()} context lengths")
    slots = state_slots.to(torch.int64)
    h0 = initial_states(ssm_pool, slots, context_lens)  # the int64 slots the write-back below takes as well
    cu = cu_seqlens.to(torch.int64)
    chunk_index = None if memo is None else memo.get("fla_chunk_index")
    if chunk_index is None:
        chunk_index = prefill_chunk_index(cu, cu_seqlens_cpu)
        if memo is not None:
            memo["fla_chunk_index"] = chunk_index
    o, final = chunk_gated_delta_rule(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), g.unsqueeze(0), beta.unsqueeze(0), scale=scale,
        initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu, cu_seqlens_cpu=cu_seqlens_cpu, chunk_indices=chunk_index.indices, chunk_size=FLA_CHUNK,
    )
    ssm_pool.index_copy_(0, slots, final.to(ssm_pool.dtype))
    return o[0]

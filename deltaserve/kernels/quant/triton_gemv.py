"""Bandwidth-oriented affine (MLX layout) GEMV for decode: y = x W^T for M <= 16 rows of x.

Same meaning as `kernels/quant/affine.py::affine_linear` up to bf16 rounding of the dequantised weight (this kernel
never rounds w: it is closer to the exact product than the reference). Layout (see `kernels/triton_common.py`):
w uint32 [N, K*BITS/32] (32/BITS codes per word, lowest bits first), scales/biases [N, K/GROUP]; or a dense
[N, K] weight with BITS = 16.

Work split: a program owns BN output features and the FULL K (no split-K), for MB rows of x. K is a compile-time
constant, so the chunk loop is unrolled; the compiler issues a chunk's loads where they are written, so chunks
c+1 and c+2 are requested before chunk c is reduced (_first_chunks / _next_chunk; sm_90 SASS showed the plain loop
waiting one memory latency per chunk). Packed weights take row runs by default (row_run_config): BN = 4 rows
over the whole K in one chunk, one 128-bit load per thread and row, so each thread reads its x positions once
for all BN rows (before: once per row, the GEMVs' L1 bound).
Grid (cdiv(N, BN), cdiv(M, MB)).

Cheap dequant, by the group factorisation  sum_k (s q_k + b) x_k = s * (sum_k q_k x_k) + b * (sum_k x_k):
per weight element one shift+mask, the exact int->fp32 trick (q | 0x4B000000 read as fp32 is 2^23 + q, minus 2^23)
and one FMA per row of x; s and b are applied once per group.

Batch invariance: a chunk's words are a [BN, CG * GW] tile (rows; the chunk's groups x words per group) whatever
M is, and row i of x is reduced against it by the same helper (`_row_part`) into its own [BN, CG] fp32 accumulator,
chunks added in order, groups summed once at the end. So a row's arithmetic depends on (N, K, BITS, GROUP, BN, CG,
num_warps) only, never on M or on which rows share the program.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from ..gated_delta.triton_decode import DecodeConv, check_decode_conv, conv_apply, conv_epilogue, conv_inputs
from ..launch_table import value as launch_value
from ..triton_common import DENSE_BITS, WeightSpec, code_prescale
from ..triton_pdl import pdl_args, pdl_open, pdl_wait
from .triton_gemv_inline import group_sums, inline_mode, row_part_inline

MAX_ROWS = 16  # the GEMV regime; larger M belongs to triton_affine.affine_matmul (tensor cores)
MAGIC = 0x4B000000  # fp32 bits of 2^23: OR a code into its mantissa to read 2^23 + code
ROW_BLOCK = 8  # rows of x per program at most (M = 9..16 runs two row blocks, each reading W from L2)
ROW_BLOCK_INLINE = 4  # with the prep inlined (see row_cap)


@triton.jit
def _prep_kernel(x_ptr, xp_ptr, xs_ptr, stride_xm, stride_pm, stride_sm, K: tl.constexpr, BITS: tl.constexpr,
                 GROUP: tl.constexpr, PDL: tl.constexpr = False):
    """grid (M,): prep_row for row m of x (row pitches stride_xm, stride_pm / stride_sm of xp / xs)."""
    pdl_open(PDL)
    pdl_wait(PDL)  # x is the previous kernel's output
    m = tl.program_id(0).to(tl.int64)
    prep_row(x_ptr + m * stride_xm, xp_ptr + m * stride_pm, xs_ptr + m * stride_sm, K, BITS, GROUP)


@triton.jit
def prep_row(x_row, xp_row, xs_row, K: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr,
             XP: tl.constexpr = True):
    """One row of x (bf16/fp16, K features) -> xp[i, j] = fp32 x[j*PACK + i] * 2^-(BITS * (i % (PACK/2))) (the
    codes' order, code i of word j, pre-scaled by the power of two the shift-free decode leaves on code i: exact),
    and xs[g] = sum of the row's group g (fp32, one fixed order). The one prep: _prep_kernel and the RMSNorm that
    preps its output (kernels/triton_norm.py) both call it, so their outputs are the same bits (4 warps). XP False:
    the group sums alone (the tensor-core MoE reads only them), by the same code."""
    if XP:
        PACK: tl.constexpr = 32 // BITS
        KW: tl.constexpr = K // PACK
        j = tl.arange(0, KW)
        i = tl.arange(0, PACK)
        xv = tl.load(x_row + j[:, None] * PACK + i[None, :]).to(tl.float32)
        tl.store(xp_row + i[None, :] * KW + j[:, None], xv * code_prescale(i, BITS)[None, :])
    g = tl.arange(0, K // GROUP)
    e = tl.arange(0, GROUP)
    xg = tl.load(x_row + g[:, None] * GROUP + e[None, :]).to(tl.float32)
    tl.store(xs_row + g, pairwise_sums(xg, K // GROUP, GROUP))


@triton.jit
def pairwise_sums(v, G: tl.constexpr, GROUP: tl.constexpr):
    """[G, GROUP] fp32 -> [G]: each row summed by one fixed pairwise tree (elements 2i and 2i + 1 first, then
    the pairs' sums likewise, ...; GROUP a power of two). Each level is a sum over an axis of two elements, whose
    only result is a + b (= b + a) whichever threads hold them, so any kernel holding the values in any layout
    gets the same bits (the RMSNorm makes them from its registers) without moving them through shared memory."""
    t = tl.reshape(v, [G] + [2] * (GROUP.bit_length() - 1))
    for _ in tl.static_range(GROUP.bit_length() - 1):
        t = tl.sum(t, axis=len(t.shape) - 1)
    return t


@triton.jit
def _code_dot(d, src, xi, magic, SH: tl.constexpr, BITS: tl.constexpr):
    """d + (code at bits [SH, SH+BITS) of src) * 2^SH * xi, exactly as d + q * x (xi, fp32 values, carries 2^-SH).
    (src & mask) | 0x4B000000 read as fp32 is 2^23 + q*2^SH (the field lies inside the 23-bit mantissa); minus
    2^23 is exact. One LOP3 + FADD + FFMA per code: no shift, no bit-field extract, no I2F. magic (= 0x4B000000)
    is a kernel argument so that it sits in a register and the AND and the OR fuse into one LOP3 (a LOP3 takes
    one immediate)."""
    v = ((src & (((1 << BITS) - 1) << SH)) | magic).to(tl.float32, bitcast=True) - 8388608.0
    return d + v * xi


@triton.jit
def _row_part(p, ph, s, b, magic, x_row, xp_row, xs_row, c, KW: tl.constexpr, CG: tl.constexpr,
              BITS: tl.constexpr, GROUP: tl.constexpr, INLINE: tl.constexpr):
    """One row of x against chunk c: s * (q . x_g) + b * sum(x_g) per (feature, group), fp32 [BN, CG].
    p: the chunk's words [BN, CG * GW] (int32), ph = p >> 16 (codes of the upper half-word moved into the
    mantissa's reach). INLINE (1 or 2, triton_gemv_inline.inline_mode): x_row is the raw row (row_part_inline,
    2: read in pairs); else (0) xp_row/xs_row
    are its _prep_kernel output. Codes are added in order i = 0 .. PACK-1 per word, words summed per group by tl.sum."""
    if INLINE:
        return row_part_inline(p, ph, s, b, magic, x_row, c, CG, BITS, GROUP, INLINE == 2)
    else:
        PACK: tl.constexpr = 32 // BITS
        HALF: tl.constexpr = PACK // 2
        GW: tl.constexpr = GROUP // PACK
        xo = c * (CG * GW) + tl.arange(0, CG * GW)  # [CG * GW]: one x tile for every row of the chunk
        d = tl.zeros(p.shape, dtype=tl.float32)
        for i in tl.static_range(HALF):
            d = _code_dot(d, p, tl.load(xp_row + i * KW + xo)[None, :], magic, BITS * i, BITS)
        for i in tl.static_range(HALF):
            d = _code_dot(d, ph, tl.load(xp_row + (HALF + i) * KW + xo)[None, :], magic, BITS * i, BITS)
        g = c * CG + tl.arange(0, CG)
        xs = tl.load(xs_row + g)
        # s * sum + b * xs with its one fused multiply-add spelled out: left to the compiler, which of the two
        # products is fused may differ between the kernels that inline this helper, and so would their bits
        return tl.fma(s, group_sums(d, CG, GW), b * xs[None, :])


@triton.jit
def _dense_part(wv, x_row, c, BKD: tl.constexpr):
    """One row of x against a dense chunk wv [BN, BKD] (fp32): products kept per column until the end."""
    k = c * BKD + tl.arange(0, BKD)
    xv = tl.load(x_row + k).to(tl.float32)
    return wv * xv[None, :]


@triton.jit
def _store_row(out_ptr, acc, rn, n_mask, m, M, stride_om, AXES: tl.constexpr):
    y = tl.sum(acc, axis=1)
    tl.store(out_ptr + m.to(tl.int64) * stride_om + rn, y.to(out_ptr.dtype.element_ty), mask=n_mask & (m < M))


@triton.jit
def _finish_row(out_ptr, acc, rn, n_mask, m, M, stride_om, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C, stride_cwc,
                stride_cwk, stride_ps, stride_pc, stride_pk, CONV: tl.constexpr, KCONV: tl.constexpr):
    if CONV:
        conv_epilogue(out_ptr, acc, rn, n_mask, m, M, stride_om, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C,
                      stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk, KCONV)
    else:
        _store_row(out_ptr, acc, rn, n_mask, m, M, stride_om, 1)


@triton.jit
def _load_chunk(w_ptr, s_ptr, b_ptr, rn64, n_mask, stride_wn, stride_sn, c, BITS: tl.constexpr,
                GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr):
    """Chunk c of the BN weight rows rn64: packed (words [BN, CG * GW] int32, scales and biases [BN, CG] fp32) or
    dense (the fp32 values [BN, CG * GROUP], returned three times so both kinds unpack alike). The one place the
    GEMVs (gemv_row, _gemv_kernel) read weights."""
    if BITS == 16:
        kk = c * (CG * GROUP) + tl.arange(0, CG * GROUP)
        wv = tl.load(w_ptr + rn64[:, None] * stride_wn + kk[None, :], mask=n_mask[:, None], other=0.0).to(tl.float32)
        return wv, wv, wv
    else:
        # the chunk's words are one contiguous run per row, so the compiler lays the [BN, CG * GW] tile out along
        # K first: when one row's run covers every thread's 128-bit load, each thread holds the same K positions
        # of all BN rows and reads their x once (see _row_part)
        CGW: tl.constexpr = CG * GROUP * BITS // 32
        j = c * CGW + tl.arange(0, CGW)
        p = tl.load(w_ptr + rn64[:, None] * stride_wn + j[None, :], mask=n_mask[:, None], other=0)
        g = c * CG + tl.arange(0, CG)
        sofs = rn64[:, None] * stride_sn + g[None, :]
        s = tl.load(s_ptr + sofs, mask=n_mask[:, None], other=0.0).to(tl.float32)
        b = tl.load(b_ptr + sofs, mask=n_mask[:, None], other=0.0).to(tl.float32)
        return p, s, b


@triton.jit
def _first_chunks(w_ptr, s_ptr, b_ptr, rn64, n_mask, stride_wn, stride_sn, NC: tl.constexpr, BITS: tl.constexpr,
                  GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr):
    """Chunks 0 and 1 (chunk 0 twice when NC == 1): the start of the GEMVs' two-chunk lookahead. The lookahead
    exists because the compiler issues each chunk's loads where they are written: without it one chunk's latency
    is exposed after another (sm_90 SASS)."""
    c0 = _load_chunk(w_ptr, s_ptr, b_ptr, rn64, n_mask, stride_wn, stride_sn, 0, BITS, GROUP, BN, CG)
    c1 = c0
    if NC > 1:
        c1 = _load_chunk(w_ptr, s_ptr, b_ptr, rn64, n_mask, stride_wn, stride_sn, 1, BITS, GROUP, BN, CG)
    return c0, c1


@triton.jit
def _next_chunk(nxt1, nxt2, w_ptr, s_ptr, b_ptr, rn64, n_mask, stride_wn, stride_sn, c, NC: tl.constexpr,
                BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr):
    """One step of the lookahead at chunk c: (chunk c, chunk c+1, chunk c+2) from the two held, chunk c+2 requested
    now (while chunk c is reduced) when it exists."""
    nxt3 = nxt2
    if c + 2 < NC:
        nxt3 = _load_chunk(w_ptr, s_ptr, b_ptr, rn64, n_mask, stride_wn, stride_sn, c + 2, BITS, GROUP, BN, CG)
    return nxt1, nxt2, nxt3


@triton.jit
def gemv_row(x_row, xp_row, xs_row, w_ptr, s_ptr, b_ptr, rn, n_mask, stride_wn, stride_sn, magic,
             K: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr,
             INLINE: tl.constexpr = 1, PDL_WAIT: tl.constexpr = False):
    """W[rn, :K] . x as fp32 [BN] for ONE row of x, with exactly the per-row arithmetic of _gemv_kernel (same
    helpers, same chunking): x_row is the bf16 row (read for dense weights, and for packed ones when INLINE),
    xp_row/xs_row its _prep_kernel output (read for packed weights when not INLINE; pass anything otherwise).
    PDL_WAIT: the caller was launched with PDL and has not waited yet: wait (triton_pdl.pdl_wait) once the first
    chunk's weights are requested, before x is read."""
    y, _ = gemv_row_pair(x_row, xp_row, xs_row, w_ptr, s_ptr, b_ptr, w_ptr, s_ptr, b_ptr, rn, n_mask, stride_wn,
                         stride_sn, stride_wn, stride_sn, magic, K, BITS, GROUP, BN, CG, INLINE, PDL_WAIT, False)
    return y


@triton.jit
def gemv_row_pair(x_row, xp_row, xs_row, w_ptr, s_ptr, b_ptr, w2_ptr, s2_ptr, b2_ptr, rn, n_mask, stride_wn,
                  stride_sn, stride_w2n, stride_s2n, magic, K: tl.constexpr, BITS: tl.constexpr,
                  GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr, INLINE: tl.constexpr,
                  PDL_WAIT: tl.constexpr, TWO: tl.constexpr):
    """(W[rn] . x, W2[rn] . x) as fp32 [BN] each for one row of x and two weights of one format and shape (TWO;
    else the first twice, W2 unread). Each weight's arithmetic is gemv_row's exactly (same chunks, same helpers,
    same order), so a pair gives the bits of two gemv_row calls; what changes is when the loads are issued: both
    weights' chunks c+1 and c+2 are requested before chunk c is reduced, so the second weight's loads no longer
    wait behind the first weight's FMAs (sm_90 SASS of the MoE gate/up: the up weight's first load sat after the
    gate's last FMA), and the x tile of a chunk is read once for both."""
    rn64 = rn.to(tl.int64)
    NC: tl.constexpr = K // (CG * GROUP)
    acc = _row_acc(BITS, GROUP, BN, CG)
    acc2 = acc
    # both weights' chunks c+1 and c+2 are requested before chunk c is reduced (_first_chunks, _next_chunk)
    nxt1, nxt2 = _first_chunks(w_ptr, s_ptr, b_ptr, rn64, n_mask, stride_wn, stride_sn, NC, BITS, GROUP, BN, CG)
    mxt1, mxt2 = nxt1, nxt2
    if TWO:
        mxt1, mxt2 = _first_chunks(w2_ptr, s2_ptr, b2_ptr, rn64, n_mask, stride_w2n, stride_s2n, NC, BITS, GROUP, BN,
                                   CG)
    for c in tl.static_range(NC):
        cur, nxt1, nxt2 = _next_chunk(nxt1, nxt2, w_ptr, s_ptr, b_ptr, rn64, n_mask, stride_wn, stride_sn, c, NC,
                                      BITS, GROUP, BN, CG)
        if TWO:
            cur2, mxt1, mxt2 = _next_chunk(mxt1, mxt2, w2_ptr, s2_ptr, b2_ptr, rn64, n_mask, stride_w2n, stride_s2n,
                                           c, NC, BITS, GROUP, BN, CG)
        if c == 0:
            pdl_wait(PDL_WAIT)
        acc = _chunk_dot(acc, cur, magic, x_row, xp_row, xs_row, c, K, BITS, GROUP, BN, CG, INLINE)
        if TWO:
            acc2 = _chunk_dot(acc2, cur2, magic, x_row, xp_row, xs_row, c, K, BITS, GROUP, BN, CG, INLINE)
    return tl.sum(acc, axis=1), tl.sum(acc2, axis=1)


@triton.jit
def _row_acc(BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr):
    """A row's zero accumulator for gemv_row's chunks: [BN, CG * GROUP] per element (dense) or [BN, CG] per group."""
    if BITS == 16:
        return tl.zeros((BN, CG * GROUP), dtype=tl.float32)
    else:
        return tl.zeros((BN, CG), dtype=tl.float32)


@triton.jit
def gemv_row_chunks(w_ptr, s_ptr, b_ptr, rn, n_mask, stride_wn, stride_sn, K: tl.constexpr, BITS: tl.constexpr,
                    GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr):
    """gemv_row in two parts for a caller with work between its weight requests and its x (the router launch that
    makes its input's norm after its PDL wait): this part requests the first two chunks of W[rn] (gemv_row's
    lookahead), gemv_row_from consumes them. Together: gemv_row's instructions on the same values, the same bits."""
    NC: tl.constexpr = K // (CG * GROUP)
    return _first_chunks(w_ptr, s_ptr, b_ptr, rn.to(tl.int64), n_mask, stride_wn, stride_sn, NC, BITS, GROUP, BN, CG)


@triton.jit
def gemv_row_from(chunks, x_row, w_ptr, s_ptr, b_ptr, rn, n_mask, stride_wn, stride_sn, magic, K: tl.constexpr,
                  BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr, INLINE: tl.constexpr,
                  res_row=None, nw_row=None, inv=0.0, offset=0.0, NORMED: tl.constexpr = False):
    """W[rn, :K] . x as fp32 [BN] for one row of x read raw (INLINE 1 or 2, or a dense weight) from the chunks
    gemv_row_chunks requested: gemv_row_pair's loop for one weight, without a wait (the caller has waited).
    NORMED (a packed weight): x is the add-norm of x_row + res_row (norm weight nw_row, 1 / rms inv, offset), made
    at the chunk's x loads (row_part_inline NORMED): the same values as reading the norm's stored row, the same
    bits, without the round trip."""
    rn64 = rn.to(tl.int64)
    NC: tl.constexpr = K // (CG * GROUP)
    acc = _row_acc(BITS, GROUP, BN, CG)
    nxt1, nxt2 = chunks
    for c in tl.static_range(NC):
        cur, nxt1, nxt2 = _next_chunk(nxt1, nxt2, w_ptr, s_ptr, b_ptr, rn64, n_mask, stride_wn, stride_sn, c, NC,
                                      BITS, GROUP, BN, CG)
        if NORMED:  # _chunk_dot's packed step with the x tiles made from the norm's inputs
            p, s, b = cur
            acc = acc + row_part_inline(p, p >> 16, s, b, magic, x_row, c, CG, BITS, GROUP, False, res_row, nw_row,
                                        inv, offset, True)
        else:
            acc = _chunk_dot(acc, cur, magic, x_row, x_row, x_row, c, K, BITS, GROUP, BN, CG, INLINE)
    return tl.sum(acc, axis=1)


@triton.jit
def _chunk_dot(acc, chunk, magic, x_row, xp_row, xs_row, c, K: tl.constexpr, BITS: tl.constexpr,
               GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr, INLINE: tl.constexpr):
    """acc + one row of x against chunk c (a _load_chunk result): gemv_row's per-chunk step."""
    p, s, b = chunk
    if BITS == 16:
        return acc + _dense_part(p, x_row, c, CG * GROUP)
    else:
        PACK: tl.constexpr = 32 // BITS
        return acc + _row_part(p, p >> 16, s, b, magic, x_row, xp_row, xs_row, c, K // PACK, CG, BITS, GROUP, INLINE)


@triton.jit
def _chunk_row(acc, wv, p, ph, s, b, magic, x_ptr, xp_ptr, xs_ptr, r, stride_xm, c, K: tl.constexpr,
               BITS: tl.constexpr, GROUP: tl.constexpr, CG: tl.constexpr, INLINE: tl.constexpr):
    """acc + row r of x against chunk c (dense: wv; packed: p/ph/s/b), the per-row step of _gemv_kernel."""
    x_row = x_ptr + r.to(tl.int64) * stride_xm
    if BITS == 16:
        return acc + _dense_part(wv, x_row, c, CG * GROUP)
    else:
        PACK: tl.constexpr = 32 // BITS
        return acc + _row_part(p, ph, s, b, magic, x_row, xp_ptr + r * K, xs_ptr + r * (K // GROUP), c,
                               K // PACK, CG, BITS, GROUP, INLINE)


@triton.jit
def _gemv_kernel(
    x_ptr, xp_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_sn, stride_om, magic,
    cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C, stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk,
    K: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr,
    MB: tl.constexpr, INLINE: tl.constexpr = 0, CONV: tl.constexpr = False, KCONV: tl.constexpr = 4,
    PDL: tl.constexpr = False, CONV_EARLY: tl.constexpr = False,
):
    # grid (cdiv(N, BN), cdiv(M, MB)): _gemv_block for row block program_id(0). PDL (triton_pdl): the first chunk's
    # weights are requested before waiting for the kernel that wrote x. CONV_EARLY (CONV, MB 1): the conv's inputs
    # are requested before that wait too (gated_delta.triton_decode.conv_inputs says why that is safe).
    pdl_open(PDL)
    _gemv_block(tl.program_id(0), x_ptr, xp_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn,
                stride_sn, stride_om, magic, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C, stride_cwc, stride_cwk, stride_ps,
                stride_pc, stride_pk, K, BITS, GROUP, BN, CG, MB, INLINE, CONV, KCONV, PDL, CONV_EARLY)


@triton.jit
def _gemv_blocks_kernel(
    x_ptr, xp_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_sn, stride_om, magic,
    K: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr,
    MB: tl.constexpr, NBLK: tl.constexpr, INLINE: tl.constexpr = 0, PDL: tl.constexpr = False,
):
    # grid (cdiv(N, BN * NBLK), cdiv(M, MB)): _gemv_block for NBLK consecutive row blocks in turn, the MB rows of x
    # the same throughout (their reads after the first block come from L1 instead of L2): every row's arithmetic is
    # _gemv_kernel's. Blocks past N are masked (their rows store nothing).
    pdl_open(PDL)
    blk = tl.program_id(0) * NBLK
    _gemv_block(blk, x_ptr, xp_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_sn,
                stride_om, magic, x_ptr, x_ptr, x_ptr, x_ptr, 0, 0, 0, 0, 0, 0, K, BITS, GROUP, BN, CG, MB, INLINE,
                False, 4, PDL)  # the first block waits (PDL) once its first chunk's weights are requested
    for nb in tl.static_range(1, NBLK):
        _gemv_block(blk + nb, x_ptr, xp_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn,
                    stride_sn, stride_om, magic, x_ptr, x_ptr, x_ptr, x_ptr, 0, 0, 0, 0, 0, 0, K, BITS, GROUP, BN, CG,
                    MB, INLINE, False, 4, False)


@triton.jit
def _gemv_block(
    blk, x_ptr, xp_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_sn, stride_om, magic,
    cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C, stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk,
    K: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr,
    MB: tl.constexpr, INLINE: tl.constexpr, CONV: tl.constexpr, KCONV: tl.constexpr, PDL_WAIT: tl.constexpr,
    CONV_EARLY: tl.constexpr = False,
):
    # weight rows blk * BN .. + BN - 1 against rows m0 .. m0+MB-1 of x (m0 = program_id(1) * MB), each with its own
    # accumulator (a0..a7). Rows past M read row M-1 (valid memory) and are not stored. INLINE: x is read raw
    # (xp/xs unused); CONV: the decode conv runs in the epilogue (_store_row_conv; cw/pool/slot/ctx unused
    # otherwise). PDL_WAIT: wait for the kernel that wrote x (triton_pdl) once the first chunk's weights are
    # requested.
    rn = blk * BN + tl.arange(0, BN)
    n_mask = rn < N
    rn64 = rn.to(tl.int64)
    m0 = tl.program_id(1) * MB
    r1 = tl.minimum(m0 + 1, M - 1)
    r2 = tl.minimum(m0 + 2, M - 1)
    r3 = tl.minimum(m0 + 3, M - 1)
    r4 = tl.minimum(m0 + 4, M - 1)
    r5 = tl.minimum(m0 + 5, M - 1)
    r6 = tl.minimum(m0 + 6, M - 1)
    r7 = tl.minimum(m0 + 7, M - 1)
    if BITS == 16:
        acc_shape: tl.constexpr = (BN, CG * GROUP)  # dense: chunks of CG * GROUP elements
    else:
        acc_shape: tl.constexpr = (BN, CG)
    a0 = tl.zeros(acc_shape, dtype=tl.float32)
    a1 = tl.zeros(acc_shape, dtype=tl.float32)
    a2 = tl.zeros(acc_shape, dtype=tl.float32)
    a3 = tl.zeros(acc_shape, dtype=tl.float32)
    a4 = tl.zeros(acc_shape, dtype=tl.float32)
    a5 = tl.zeros(acc_shape, dtype=tl.float32)
    a6 = tl.zeros(acc_shape, dtype=tl.float32)
    a7 = tl.zeros(acc_shape, dtype=tl.float32)
    NC: tl.constexpr = K // (CG * GROUP)
    # the two-chunk lookahead of gemv_row; with PDL chunks 0..2 are requested before the wait
    nxt1, nxt2 = _first_chunks(w_ptr, s_ptr, b_ptr, rn64, n_mask, stride_wn, stride_sn, NC, BITS, GROUP, BN, CG)
    EARLY: tl.constexpr = CONV and CONV_EARLY and MB == 1
    conv_in = 0
    if EARLY:  # the conv's weights, window and metadata: requested before the wait (conv_inputs)
        conv_in = conv_inputs(rn, n_mask, m0, M, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C, stride_cwc, stride_cwk,
                              stride_ps, stride_pc, stride_pk, KCONV)
    for c in tl.static_range(NC):
        cur, nxt1, nxt2 = _next_chunk(nxt1, nxt2, w_ptr, s_ptr, b_ptr, rn64, n_mask, stride_wn, stride_sn, c, NC,
                                      BITS, GROUP, BN, CG)
        if c == 0:
            pdl_wait(PDL_WAIT)
        p, s, b = cur
        wv = p  # dense: the chunk's values (s, b unused)
        ph = p  # dense: unused
        if BITS != 16:
            ph = p >> 16
        a0 = _chunk_row(a0, wv, p, ph, s, b, magic, x_ptr, xp_ptr, xs_ptr, m0, stride_xm, c, K, BITS, GROUP,
                        CG, INLINE)
        if MB > 1:
            a1 = _chunk_row(a1, wv, p, ph, s, b, magic, x_ptr, xp_ptr, xs_ptr, r1, stride_xm, c, K, BITS,
                            GROUP, CG, INLINE)
        if MB > 2:
            a2 = _chunk_row(a2, wv, p, ph, s, b, magic, x_ptr, xp_ptr, xs_ptr, r2, stride_xm, c, K, BITS,
                            GROUP, CG, INLINE)
            a3 = _chunk_row(a3, wv, p, ph, s, b, magic, x_ptr, xp_ptr, xs_ptr, r3, stride_xm, c, K, BITS,
                            GROUP, CG, INLINE)
        if MB > 4:
            a4 = _chunk_row(a4, wv, p, ph, s, b, magic, x_ptr, xp_ptr, xs_ptr, r4, stride_xm, c, K, BITS,
                            GROUP, CG, INLINE)
            a5 = _chunk_row(a5, wv, p, ph, s, b, magic, x_ptr, xp_ptr, xs_ptr, r5, stride_xm, c, K, BITS,
                            GROUP, CG, INLINE)
            a6 = _chunk_row(a6, wv, p, ph, s, b, magic, x_ptr, xp_ptr, xs_ptr, r6, stride_xm, c, K, BITS,
                            GROUP, CG, INLINE)
            a7 = _chunk_row(a7, wv, p, ph, s, b, magic, x_ptr, xp_ptr, xs_ptr, r7, stride_xm, c, K, BITS,
                            GROUP, CG, INLINE)
    if EARLY:
        conv_apply(out_ptr, a0, rn, n_mask, m0, M, stride_om, pool_ptr, C, conv_in, stride_pk, KCONV)
    else:
        _finish_row(out_ptr, a0, rn, n_mask, m0, M, stride_om, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C,
                    stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk, CONV, KCONV)
    if MB > 1:
        _finish_row(out_ptr, a1, rn, n_mask, m0 + 1, M, stride_om, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C,
                    stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk, CONV, KCONV)
    if MB > 2:
        _finish_row(out_ptr, a2, rn, n_mask, m0 + 2, M, stride_om, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C,
                    stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk, CONV, KCONV)
        _finish_row(out_ptr, a3, rn, n_mask, m0 + 3, M, stride_om, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C,
                    stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk, CONV, KCONV)
    if MB > 4:
        _finish_row(out_ptr, a4, rn, n_mask, m0 + 4, M, stride_om, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C,
                    stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk, CONV, KCONV)
        _finish_row(out_ptr, a5, rn, n_mask, m0 + 5, M, stride_om, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C,
                    stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk, CONV, KCONV)
        _finish_row(out_ptr, a6, rn, n_mask, m0 + 6, M, stride_om, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C,
                    stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk, CONV, KCONV)
        _finish_row(out_ptr, a7, rn, n_mask, m0 + 7, M, stride_om, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C,
                    stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk, CONV, KCONV)


def row_block(m: int, cap: int = ROW_BLOCK) -> int:
    """Rows of x per program: the next power of two up to cap (rows beyond M are masked). A row's arithmetic
    does not depend on this choice (each row has its own accumulator and the same helpers)."""
    return min(cap, triton.next_power_of_2(max(m, 1)))


def row_cap(spec: WeightSpec, inline_prep: bool, conv: bool) -> int:
    """Rows per program, from sm_90 register counts (cuobjdump at K = 2048, q4 g64): packed weights with the
    inline prep need all 255 registers at 8 rows (the prep path 179) and 168 at 4 (188 with the conv epilogue);
    dense weights with the conv epilogue spill at 4 (264 B) and not at 2 (201 registers)."""
    if spec.bits == DENSE_BITS:
        return 2 if conv else ROW_BLOCK
    return ROW_BLOCK_INLINE if inline_prep else ROW_BLOCK


def row_run_config(spec: WeightSpec, bn: int) -> tuple[int, int, int] | None:
    """(bn, CG, num_warps) whose chunk is one row's run of words covered by every thread's 128-bit load exactly
    once (4 words per thread, up to 8 warps, the whole K when it fits): the tile [bn, CG * GW] is then laid out
    along K first, each thread holds the same K positions of all bn rows and reads their x once, instead of once
    per row (sass_report at sm_90, 12352 x 2048: 8 x-loads per weight load -> 1). None for dense weights or when
    a row has fewer than 128 words (the threads would spread over rows again)."""
    if spec.bits == DENSE_BITS:
        return None
    words = spec.k * spec.bits // 32
    gw = spec.group * spec.bits // 32
    if words < 128:
        return None
    warps = min(8, words // 128)
    return bn, 128 * warps // gw, warps


def row_run_bn() -> int:
    """BN of the default row runs: launch_table "gemv.row_run_bn" (0: no row runs)."""
    return launch_value("gemv.row_run_bn")


def default_config(spec: WeightSpec) -> tuple[int, int, int]:
    """(BN, CG, num_warps). CG = groups per chunk (dense: CG * 64 elements per chunk). Depends on the weight
    only, never on M. Packed weights with rows of >= 128 words: row_run_config(spec, row_run_bn()), BN = 4 rows per
    program over the whole K (H200 sweep, lab/NOTES.md: 12352 x 2048 8.66 -> 8.52 us at M = 1 and 37.6 -> 27.3
    at M = 8; 2048 x 4096 9.81 -> 4.59 us). Otherwise chunks of BN * CG * GROUP codes, ~32 per thread at 4 warps;
    BN = 8 keeps >= 4 programs per SM from N = 4096, and a packed weight of fewer than launch_table
    "gemv.few_programs" such programs takes twice the programs at half the warps (2048 x 4096 before the row runs:
    9.50 -> 7.35 us)."""
    rr = row_run_bn()
    run = row_run_config(spec, rr) if rr else None
    if run is not None:
        return run
    if spec.bits != DENSE_BITS and triton.cdiv(spec.n, 8) < launch_value("gemv.few_programs"):
        return 4, chunk_groups(spec, 4), 2
    return 8, chunk_groups(spec, 8), 4  # dense: 8 x 512 bf16 chunks


def unit(spec: WeightSpec) -> int:
    """The GROUP the kernels are compiled with: the quantisation group, or for a dense weight the chunk unit
    (64, 32 or 16 elements, the largest dividing K)."""
    if spec.bits != DENSE_BITS:
        return spec.group
    for u in (64, 32, 16):
        if spec.k % u == 0:
            return u
    raise ValueError(f"dense weight: K = {spec.k} is not a multiple of 16")


def chunk_groups(spec: WeightSpec, bn: int = 8, codes: int = 4096) -> int:
    """CG for a weight: chunks of ~`codes` codes for bn features, whole groups, dividing K."""
    group = unit(spec)
    cg = triton.next_power_of_2(max(1, min(codes // (bn * group), spec.k // group)))
    while cg > 1 and spec.k % (cg * group):
        cg //= 2
    if spec.k % (cg * group):
        raise ValueError(f"K = {spec.k} is not a multiple of the group size {group}")
    return cg


def prep_x(x2: torch.Tensor, bits: int, group: int, k: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(xp, xs) for the first k features of rows x2 [R, width] (features contiguous): deinterleaved pre-scaled
    fp32 x [R, width] and per-group sums [R, width / group], row pitches width and width / group."""
    r, width = x2.shape
    k = width if k is None else k
    if width % group or k % group:
        raise ValueError(f"prep_x: width {width} / features {k} not multiples of the group size {group}")
    xp = torch.empty(r, width, dtype=torch.float32, device=x2.device)
    xs = torch.empty(r, width // group, dtype=torch.float32, device=x2.device)
    if r:
        _prep_kernel[(r,)](x2, xp, xs, x2.stride(0), xp.stride(0), xs.stride(0), K=k, BITS=bits, GROUP=group,
                           num_warps=4, **pdl_args(x2))
    return xp, xs


def check_prep(prep: tuple, m: int, spec: WeightSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(xp, xs) given for m rows of x against a packed weight, checked: contiguous fp32 [m, K] and [m, K / group]
    (prep_x's layout: the GEMV reads row r at r * K and r * K / group)."""
    xp, xs = prep
    for t, width, name in ((xp, spec.k, "xp"), (xs, spec.k // spec.group, "xs")):
        if t.dtype != torch.float32 or tuple(t.shape) != (m, width) or not t.is_contiguous():
            raise ValueError(f"affine_gemv prep: {name} must be contiguous fp32 [{m}, {width}], found "
                             f"{t.dtype} {tuple(t.shape)} strides {t.stride()}")
    return xp, xs


def gemv_spec(qweight, scales, biases, bits: int, group: int, name: str) -> WeightSpec:
    spec = WeightSpec(qweight, scales, biases, bits, group, name)
    if spec.w.dim() != 2:
        raise ValueError(f"{name}: weight must be 2-D [N, packed K], found shape {tuple(qweight.shape)}")
    return spec


def use_inline_prep(spec: WeightSpec, inline_prep: bool | None) -> bool:
    """The prep choice for a weight: explicit, or auto (None): the prep launch for every packed weight. Never by
    M, so a row's arithmetic stays independent of the batch, and not by whether PDL is on, so the bits are the
    same with serial launches. Why prep: in the model on the H200 with PDL (triton_pdl), every decoder GEMV
    through prep_x gave tg128 @ d512 452.3 tok/s against 421.5 with x read inline (lab/NOTES.md), the extra
    launch hidden by PDL while the GEMV's x reads get cheaper; without PDL the inline path was the faster one
    (the sweep: 2048x4096 7.1 vs 10.1 us)."""
    return bool(inline_prep) and spec.bits != DENSE_BITS  # None (auto) -> prep


def launch_gemv(x2: torch.Tensor, spec: WeightSpec, out: torch.Tensor, config=None, inline_prep: bool | None = None,
                conv: DecodeConv | None = None, prep: tuple | None = None, rows: int | None = None,
                blocks: int = 1) -> None:
    """x2 [M, K] (K contiguous), out [M, N] (N contiguous); M <= MAX_ROWS is the intended regime. inline_prep
    (resolved by use_inline_prep): the kernel reads x raw (one launch); else prep_x runs first (two launches, the v2
    path; the same products bit for bit, group sums in another fixed order: see triton_gemv_inline). conv: the
    decode conv in the epilogue (gated_delta.triton_decode.DecodeConv). prep: (xp, xs) of these rows already made
    (prep_row, e.g. by the RMSNorm that wrote x2): used instead of the prep launch when the prep path runs.
    rows: rows of x per program, 1, 2, 4 or 8 (default: row_block by the register cap; never a row's bits; the MoE
    router's many-token launch takes 8 at its small BN: 126 registers on sm_90, no spills).
    blocks: row blocks of BN per program, taken in turn over the same rows of x (_gemv_blocks_kernel: x re-read from
    L1 rather than L2 by each block; never a row's bits); no conv epilogue."""
    m = x2.shape[0]
    bn, cg, warps = config or default_config(spec)
    group = unit(spec)
    if spec.k % (cg * group):
        raise ValueError(f"affine_gemv: chunk of {cg} x {group} must divide K = {spec.k}")
    inline_prep = use_inline_prep(spec, inline_prep)
    if rows is not None and rows not in (1, 2, 4, 8):
        raise ValueError(f"launch_gemv: rows per program must be 1, 2, 4 or 8, found {rows}")
    mb = rows or row_block(m, row_cap(spec, inline_prep, conv is not None))
    if spec.bits == DENSE_BITS or inline_prep:
        xp = xs = x2  # unused
    elif prep is not None:
        xp, xs = check_prep(prep, m, spec)
    else:
        xp, xs = prep_x(x2, spec.bits, spec.group)
    if conv is None:
        kw, cargs = 4, (x2, x2, x2, x2, 0, 0, 0, 0, 0, 0)  # unused
    else:
        kw = check_decode_conv(conv, m, spec.n, out.dtype)
        cw, pool = conv.weight, conv.pool
        cargs = (cw, pool, conv.state_slots, conv.context_lens, conv.channels, cw.stride(0), cw.stride(1),
                 pool.stride(0), pool.stride(1), pool.stride(2))
    if blocks < 1 or (blocks > 1 and conv is not None):
        raise ValueError(f"launch_gemv: blocks per program must be >= 1, and 1 with the conv epilogue; found {blocks}")
    if blocks > 1:
        _gemv_blocks_kernel[(triton.cdiv(spec.n, bn * blocks), triton.cdiv(m, mb))](
            x2, xp, xs, spec.w, spec.scales, spec.biases, out, m, spec.n, x2.stride(0), spec.w.stride(0),
            spec.scales.stride(0), out.stride(0), MAGIC, K=spec.k, BITS=spec.bits, GROUP=group, BN=bn, CG=cg, MB=mb,
            NBLK=blocks, INLINE=inline_mode(x2, inline_prep), num_warps=warps, **pdl_args(x2))
        return
    grid = (triton.cdiv(spec.n, bn), triton.cdiv(m, mb))
    _gemv_kernel[grid](
        x2, xp, xs, spec.w, spec.scales, spec.biases, out, m, spec.n, x2.stride(0), spec.w.stride(0),
        spec.scales.stride(0), out.stride(0), MAGIC, *cargs,
        K=spec.k, BITS=spec.bits, GROUP=group, BN=bn, CG=cg, MB=mb, INLINE=inline_mode(x2, inline_prep),
        CONV=conv is not None,
        KCONV=kw, num_warps=warps, **pdl_args(x2),
        # a one-row conv epilogue's inputs requested before the PDL wait (never a bit; H200, tg64 B=1 @ d512:
        # 663.5 / 663.0 -> 672.8 / 675.4 tok/s, lab/NOTES.md)
        **({"CONV_EARLY": True} if conv is not None and mb == 1 else {}),
    )


def affine_gemv(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor | None, biases: torch.Tensor | None,
    bits: int, group: int, out: torch.Tensor | None = None, config: tuple | None = None, *,
    inline_prep: bool | None = None, conv: DecodeConv | tuple | None = None, prep: tuple | None = None,
) -> torch.Tensor:
    """y = x W^T for x [..., K] bf16/fp16 with at most MAX_ROWS rows; W packed uint32 [N, K*bits/32] with scales
    and biases [N, K/group] (bits 4 or 8, group 32/64/128), or dense [N, K] with bits=16 (scales = biases = None).
    Returns [..., N] in x's dtype (fp32 accumulation, rounded once). config: (BN, CG, num_warps) override.
    inline_prep: True: one launch, x read raw (kept for timing: faster without PDL); False: the prep_x launch first;
    None (default): the prep launch (use_inline_prep).
    conv: DecodeConv(weight, pool, state_slots, context_lens, channels) (or the same as a tuple): x holds one token
    per sequence, and features < channels come out as SiLU(causal conv) with the pool updated, equal bit for bit
    to this GEMV followed by gated_delta.triton_decode.causal_conv on those features.
    prep: (xp, xs) of x's rows as prep_x would make them (triton_norm.rms_norm(..., prep=...)): the prep path
    reads them instead of launching prep_x (same bits: both come from prep_row)."""
    if bits not in (4, 8, DENSE_BITS):
        raise ValueError(f"affine_gemv: bits {bits} unsupported (4, 8, or 16 for a dense weight)")
    spec = gemv_spec(qweight, scales, biases, bits, group, "affine_gemv weight")
    if x.shape[-1] != spec.k:
        raise ValueError(f"affine_gemv: input has {x.shape[-1]} features, the weight expects {spec.k}")
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"affine_gemv: activations must be bf16 or fp16, found {x.dtype}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, spec.k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"affine_gemv: {m} rows; the GEMV serves at most {MAX_ROWS} (use affine_matmul)")
    if out is None:
        out = torch.empty(m, spec.n, dtype=x.dtype, device=x.device)
    elif out.shape[-1] != spec.n or out.numel() != m * spec.n or not out.is_contiguous():
        raise ValueError(f"affine_gemv: out must be [{m}, {spec.n}] with contiguous rows, found {tuple(out.shape)}")
    if m:
        conv = DecodeConv(*conv) if conv is not None and not isinstance(conv, DecodeConv) else conv
        launch_gemv(x2, spec, out.view(m, spec.n), config, inline_prep, conv, prep)
    return out.view(*lead, spec.n)

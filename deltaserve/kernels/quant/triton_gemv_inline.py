"""The decode GEMV's x reader without a prep launch (`triton_gemv._gemv_kernel` / `gemv_row` with INLINE): each
program reads its rows of x raw (bf16 in pairs, one 32-bit load per two codes; fp16 one value at a time) in the
[CG * GW] word layout of a chunk, broadcast over the BN weight rows, and dequantises the codes against UNscaled x
(the code ORed into a per-position magic reads back as exactly q), so no pre-scaled copy of x is needed.
The products q * x are the same fp32 values, added in the same order, as the prep path's (s * q * 2^SH) * (x *
2^-SH); the group sums are the same values added in another fixed order (exactly equal whenever the fp32 sum is
exact). A row's arithmetic depends on (K, BITS, GROUP, BN, CG) only, never on M or its neighbours.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_common import residual_sum, rms_scaled


@triton.jit
def _x_tile(x_row, c, i: tl.constexpr, CG: tl.constexpr, GW: tl.constexpr, PACK: tl.constexpr):
    """fp32 x of code i (0 .. PACK-1) of every word of chunk c, [CG * GW], read from the raw bf16/fp16 row."""
    j = c * (CG * GW) + tl.arange(0, CG * GW)
    return tl.load(x_row + j * PACK + i).to(tl.float32)


@triton.jit
def _code_dot_unscaled(d, src, xv, magic, SH: tl.constexpr, BITS: tl.constexpr):
    """d + q * x for the code at bits [SH, SH+BITS) of src and UNscaled fp32 x: the field ORed into the mantissa
    of 2^(23-SH) (whose mantissa bit SH has weight 1; magic - (SH << 23) are its fp32 bits) reads as 2^(23-SH) + q,
    and subtracting 2^(23-SH) leaves q exactly. Same instruction count as triton_gemv._code_dot (one LOP3, FADD,
    FFMA) and the same product q * x (exact in fp32: an 8-bit mantissa times a code < 2^8), so no pre-scaled x
    is needed."""
    mag = magic - (SH << 23)  # a runtime value: stays in a register so AND and OR fuse into one LOP3
    v = ((src & (((1 << BITS) - 1) << SH)) | mag).to(tl.float32, bitcast=True) - (8388608.0 / (1 << SH))
    return d + v * xv


@triton.jit
def _x_pair(x_row, c, i: tl.constexpr, CG: tl.constexpr, GW: tl.constexpr, PACK: tl.constexpr):
    """fp32 x of codes i and i+1 (i even) of every word of chunk c, [CG * GW] each, from ONE 32-bit load of the two
    adjacent bf16 values (little endian: x[i] in the low half). bf16 -> fp32 is exact: the bits moved to the top."""
    j = c * (CG * GW) + tl.arange(0, CG * GW)
    w = tl.load((x_row + j * PACK + i).to(tl.pointer_type(tl.int32), bitcast=True))
    return (w << 16).to(tl.float32, bitcast=True), (w & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _x_two(x_row, c, i: tl.constexpr, CG: tl.constexpr, GW: tl.constexpr, PACK: tl.constexpr, PAIR: tl.constexpr):
    """x of codes i and i+1 as fp32 [CG * GW] tiles: one paired load when PAIR (bf16 rows, 4-byte aligned: see
    inline_mode), two loads otherwise. The same values either way."""
    if PAIR:
        return _x_pair(x_row, c, i, CG, GW, PACK)
    else:
        return _x_tile(x_row, c, i, CG, GW, PACK), _x_tile(x_row, c, i + 1, CG, GW, PACK)


@triton.jit
def _x_normed(x_row, res_row, w_row, inv, offset, c, i: tl.constexpr, CG: tl.constexpr, GW: tl.constexpr,
              PACK: tl.constexpr):
    """fp32 y of code i of every word of chunk c, [CG * GW], made where it is read: y = bf16(r * inv * (offset + w))
    with r = bf16(x + res), the add-norm's arithmetic on the raw rows x and res (so the values its kernel stores)."""
    k = (c * (CG * GW) + tl.arange(0, CG * GW)) * PACK + i
    act: tl.constexpr = x_row.dtype.element_ty
    r = residual_sum(tl.load(x_row + k), tl.load(res_row + k), act)
    return rms_scaled(r.to(tl.float32), inv, offset, tl.load(w_row + k).to(tl.float32), act).to(tl.float32)


@triton.jit
def _x_two_of(x_row, res_row, w_row, inv, offset, c, i: tl.constexpr, CG: tl.constexpr, GW: tl.constexpr,
              PACK: tl.constexpr, PAIR: tl.constexpr, NORMED: tl.constexpr):
    """Codes i and i+1's x tiles: read (_x_two) or, NORMED, made from the add-norm's inputs (_x_normed)."""
    if NORMED:
        return (_x_normed(x_row, res_row, w_row, inv, offset, c, i, CG, GW, PACK),
                _x_normed(x_row, res_row, w_row, inv, offset, c, i + 1, CG, GW, PACK))
    else:
        return _x_two(x_row, c, i, CG, GW, PACK, PAIR)


@triton.jit
def row_part_inline(p, ph, s, b, magic, x_row, c, CG: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr,
                    PAIR: tl.constexpr, res_row=None, w_row=None, inv=0.0, offset=0.0, NORMED: tl.constexpr = False):
    """triton_gemv._row_part reading the raw row (no prep launch): per chunk and pair of codes one [CG * GW]
    tile of x pairs (_x_two), broadcast over the BN weight rows, used unscaled (_code_dot_unscaled). The group
    sums come from the same tiles: per word x_0 + x_1 + ... + x_{PACK-1} in that order, then summed over the GW
    words of the group by tl.sum. The products and their order equal the prep path's bit for bit; the group sums
    add the same values in another (fixed) order, equal whenever the fp32 sums are exact (a group's bf16 values
    spanning < 2^16). NORMED: x is the add-norm of the rows x_row + res_row with weight w_row, 1 / rms inv and
    offset, made at its loads (_x_normed: the same values as the norm's stored row, so the same bits)."""
    PACK: tl.constexpr = 32 // BITS
    HALF: tl.constexpr = PACK // 2
    GW: tl.constexpr = GROUP // PACK
    d = tl.zeros(p.shape, dtype=tl.float32)
    xsum = tl.zeros((CG * GW,), dtype=tl.float32)
    for i in tl.static_range(0, HALF, 2):  # codes i, i+1 in the low half-word
        xa, xb = _x_two_of(x_row, res_row, w_row, inv, offset, c, i, CG, GW, PACK, PAIR, NORMED)
        xsum += xa
        xsum += xb
        d = _code_dot_unscaled(d, p, xa[None, :], magic, BITS * i, BITS)
        d = _code_dot_unscaled(d, p, xb[None, :], magic, BITS * (i + 1), BITS)
    for i in tl.static_range(0, HALF, 2):  # codes HALF+i, HALF+i+1 from the high half-word (ph = p >> 16)
        xa, xb = _x_two_of(x_row, res_row, w_row, inv, offset, c, HALF + i, CG, GW, PACK, PAIR, NORMED)
        xsum += xa
        xsum += xb
        d = _code_dot_unscaled(d, ph, xa[None, :], magic, BITS * i, BITS)
        d = _code_dot_unscaled(d, ph, xb[None, :], magic, BITS * (i + 1), BITS)
    return tl.fma(s, group_sums(d, CG, GW), b * tl.sum(tl.reshape(xsum, (CG, GW)), axis=1)[None, :])


@triton.jit
def group_sums(d, CG: tl.constexpr, GW: tl.constexpr):
    """Per-group sums [BN, CG] of a chunk's per-word values d [BN, CG * GW] (words of a group adjacent)."""
    return tl.sum(tl.reshape(d, (d.shape[0], CG, GW)), axis=2)


INLINE_OFF, INLINE_SINGLE, INLINE_PAIR = 0, 1, 2  # the GEMV kernels' INLINE constexpr


def inline_mode(x2, inline: bool) -> int:
    """INLINE for rows x2 [R, K]: paired 32-bit loads need bf16 rows whose every even element is 4-byte aligned
    (base address and row pitch); otherwise single loads (same values, same arithmetic), or the prep path."""
    import torch

    if not inline:
        return INLINE_OFF
    aligned = x2.dtype == torch.bfloat16 and x2.data_ptr() % 4 == 0 and (x2.shape[0] <= 1 or x2.stride(0) % 2 == 0)
    return INLINE_PAIR if aligned else INLINE_SINGLE

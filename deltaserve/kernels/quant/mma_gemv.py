"""Tensor-core GEMV for decode (1 to 64 rows of x) over a q4 g64 weight repacked in MMA fragment order.

Why: the CUDA-core GEMVs (triton_gemv.py) spend ~5 instructions per code and row of x (shift, mask, convert, one
FMA per row), so at 64 rows they are FMA-issue-bound, and at one row the per-program compute chain, not the bytes,
sets their time (lab/NOTES.md). Here the codes go through `mma.sync.m16n8k16` (bf16 in, fp32 out): per 8 codes
one 128-bit-load share, 3 shifts and 4 LOP3s make the four bf16x2 fragment registers of the A operand in place
(code | 0x4300 read as bf16 is exactly 128 + code), and the x rows are the B operand, 8 per MMA column tile.
Nothing is staged in shared memory: the weight is repacked at load time so that each thread's 128-bit load holds
exactly the codes of its A fragments (the layout below), and the kernel is written in Gluon, Triton's explicit-
layout dialect, where every layout conversion is asserted to move no data.

Repacked layout (`repack_q4`), for W [N, K] = s * q + b with q in [0, 16), s, b per (row, 64-column group):
  words int32 [N/16, K/64, 32 lanes, 4 j]   lane = 4 * rr + c (rr in 0..7, c in 0..3), j in 0..3
      word (rb, g, lane, j) holds, at bit 4 * (i1 + 2 * i2) + 16 * l (i1, i2, l in {0, 1}), the code of
      row 16 * rb + rr + 8 * i1 and column 64 * g + 16 * c + 4 * j + 2 * i2 + l.
  sb   [N/16, K/64, 8 rr, 2 i1, 2]           (s, b) of row 16 * rb + rr + 8 * i1 in group g, the weight's dtype.
The MMA sees the 64 columns of a group in the order kk = 16 j + 8 i2 + 2 c + l (its fragment order), which is the
column 16 c + 4 j + 2 i2 + l: any fixed permutation of K inside a group leaves the product's meaning unchanged, and
this one lets a thread's B fragments (column n = lane // 4, kk in {2c, 2c+1, 2c+8, 2c+9} + 16 j) be the 16
consecutive x values x[n, 64 g + 16 c : + 16], two 128-bit loads.

Arithmetic, per 16 rows x 64 columns x 8 rows of x: qx = MMA(128 + q, x) and xs, the group sums of x (given:
prep_x's or the norm's, loaded; or the kernel's own, MMA(ones, x), which costs no prep launch and has a rounding of
its own), then s * qx + (b - 128 s) * xs in fp32 = s * (q . x) + b * sum(x): the same
group factorisation as the CUDA-core GEMV, products exact, sums in the tensor core's fp32. Work split: a program
owns 16 output rows and the whole K; its W warps take interleaved groups (warp w: groups w, w + W, ...); a warp
adds its groups' results in order, then the warps' partial sums are added in a fixed order (Triton's cross-warp
reduction). The words, x and scales are loaded straight into registers, AHEAD chunks requested ahead of the one
being computed (or the whole weight slice before the PDL wait). Batch invariance: a row of x is an MMA column, whose
result does not depend on the other columns, and everything after the MMAs is per column: a row's bits depend on
(N, K, W) only, never on M
or on which rows share the launch (GPU test: rows alone == rows among 63 others). Only W changes bits; it is
fixed per K (default_warps).
"""

from __future__ import annotations


from typing import NamedTuple

import torch

from .. import backend
from ..triton_pdl import pdl_args

GROUP = 64
ROW_BLOCK = 16  # output rows per program (the MMA's M)
MAX_ROWS = 64  # rows of x per launch (8 MMA column tiles)
PAIR_COUNTERS = 1 << 16  # (tile, row-block pair) counters of the split gate/up's h at the second arrival (256 KB)
STAGE_BYTES = 128 << 10  # x staged in shared memory (the whole-slice and looped forms): at most this per program

try:  # Gluon (Triton >= 3.5); the module still imports without it: the reference and repack are plain torch
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

    HAVE_GLUON = True
except ImportError:  # pragma: no cover  (an older Triton)
    HAVE_GLUON = False


def repack_q4(w: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
              order: str = "fragment") -> tuple[torch.Tensor, torch.Tensor]:
    """MLX q4 g64 weight (w uint32 [N, K/8], scales/biases [N, K/64]) -> (words int32 [N/16, K/64, 128],
    sb [N/16, K/64, 8, 2, 2]) in the layout of the module docstring. Runs on w's device.
    order "natural": the same words and lanes, but word (rb, g, lane 4 rr + c, j) holds column
    64 g + 16 j + 8 i2 + 2 c + l at bit 4 (i1 + 2 i2) + 16 l, so the MMA's order kk is the column itself: each k16
    step of a group is 16 consecutive columns (the dequantising prefill matmul, wgmma_dense, whose bits are those
    of a plain bf16 matmul over the dequantised weight, chained over consecutive k16 steps)."""
    if w.dim() != 2 or w.dtype not in (torch.uint32, torch.int32):
        raise ValueError(f"repack_q4: expected packed words uint32 [N, K/8], found {w.dtype} {tuple(w.shape)}")
    n, kw = w.shape
    k = kw * 8
    if n % ROW_BLOCK or k % GROUP:
        raise ValueError(f"repack_q4: weight [{n}, {k}] needs N % {ROW_BLOCK} == 0 and K % {GROUP} == 0")
    g = k // GROUP
    if scales.shape != (n, g) or biases.shape != (n, g):
        raise ValueError(f"repack_q4: scales/biases must be [{n}, {g}] (group {GROUP}), found "
                         f"{tuple(scales.shape)} / {tuple(biases.shape)}")
    dev = w.device
    shifts = torch.arange(8, device=dev, dtype=torch.int32) * 4
    q = (w.view(torch.int32)[..., None] >> shifts) & 15
    if order == "fragment":  # columns 16 c + 4 j + 2 i2 + l: rb i1 rr g c j i2 l
        q = q.reshape(n // 16, 2, 8, g, 4, 4, 2, 2).permute(0, 3, 2, 4, 5, 1, 6, 7)  # rb g rr c j i1 i2 l
    elif order == "natural":  # columns 16 j + 8 i2 + 2 c + l: rb i1 rr g j i2 c l
        q = q.reshape(n // 16, 2, 8, g, 4, 2, 4, 2).permute(0, 3, 2, 6, 4, 1, 5, 7)  # rb g rr c j i1 i2 l
    else:
        raise ValueError(f"repack_q4: order must be 'fragment' or 'natural', found {order!r}")
    i1 = torch.arange(2, device=dev)[:, None, None]
    i2 = torch.arange(2, device=dev)[None, :, None]
    lo = torch.arange(2, device=dev)[None, None, :]
    words = (q.to(torch.int64) << (4 * (i1 + 2 * i2) + 16 * lo)).sum(dim=(-3, -2, -1))  # < 2^32: disjoint nibbles
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).reshape(n // 16, g, 128)
    sb = torch.stack([scales, biases], dim=-1).reshape(n // 16, 2, 8, g, 2).permute(0, 3, 2, 1, 4)
    return words.contiguous(), sb.contiguous()


def unpack_q4(words: torch.Tensor, sb: torch.Tensor,
              order: str = "fragment") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of repack_q4 (of the same order): (codes int64 [N, K], scales [N, K/64], biases [N, K/64])."""
    nb, g, _ = words.shape
    dev = words.device
    wd = words.to(torch.int64).reshape(nb, g, 8, 4, 4) & 0xFFFFFFFF  # rb g rr c j
    i1 = torch.arange(2, device=dev)[:, None, None]
    i2 = torch.arange(2, device=dev)[None, :, None]
    lo = torch.arange(2, device=dev)[None, None, :]
    q = (wd[..., None, None, None] >> (4 * (i1 + 2 * i2) + 16 * lo)) & 15  # rb g rr c j i1 i2 l
    if order == "fragment":
        q = q.permute(0, 5, 2, 1, 3, 4, 6, 7).reshape(nb * 16, g * 64)  # rb i1 rr | g c j i2 l
    elif order == "natural":
        q = q.permute(0, 5, 2, 1, 4, 6, 3, 7).reshape(nb * 16, g * 64)  # rb i1 rr | g j i2 c l
    else:
        raise ValueError(f"unpack_q4: order must be 'fragment' or 'natural', found {order!r}")
    sbt = sb.permute(0, 3, 2, 1, 4).reshape(nb * 16, g, 2)  # rb i1 rr, g, (s, b)
    return q, sbt[..., 0], sbt[..., 1]


def mma_gemv_reference(x: torch.Tensor, words: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """fp64 x W^T for the repacked weight (tests)."""
    q, s, b = unpack_q4(words, sb)
    w = (q.double().reshape(q.shape[0], -1, GROUP) * s.double()[..., None] + b.double()[..., None])
    return x.double() @ w.reshape(q.shape[0], -1).t()


def default_warps(k: int) -> int:
    """Warps per program for a K: they split K (warp w takes every W-th group), so W decides the order in which
    a row's groups are added and is fixed by the weight alone, never by the rows of x. One warp below K = 1024
    (the MoE down projection, K = 512: H200 sweep of the experts kernel, 1 warp 3.6 / 12.2 / 50.9 / 118 us at
    1 / 8 / 64 / 512 tokens against 4.4 / 16.8 / 84 / 227 with 4, lab/NOTES.md)."""
    g = k // GROUP
    if k % GROUP:
        raise ValueError(f"mma_gemv: K = {k} is not a multiple of {GROUP}")
    for warps in ((8, 4, 2, 1) if k >= 4096 else (4, 2, 1) if k >= 1024 else (1,)):
        if g % warps == 0:
            return warps
    raise ValueError(f"mma_gemv: K = {k} is not a multiple of {GROUP}")


RING_MAX_BLOCKS = 4096  # up to 8 rows, weights of fewer row blocks than this run the register ring


def default_config(k: int, m: int = 1, nb: int | None = None) -> tuple[int, int, int]:
    """(W, RB, AHEAD) for a weight of K columns (and nb row blocks of 16) at m rows of x: warps per program (they
    split K: W decides the order in which a row's groups are added, so it is fixed by the weight alone), row blocks
    of 16 per program and chunks in flight (these two never change bits, so they may follow m). H200 sweeps
    (lab/sweep_mma_gemv.py, lab/NOTES.md): at one row RB 1, AHEAD 1 for every decode linear of the 35B-A3B
    (12352 x 2048 RB 1 7.78 us, RB 2 10.98, RB 4 13.03); at 64 rows, where every program re-reads all of x from L2,
    two row blocks share those reads for K <= 2048 (12352 x 2048 55.9 -> 33.9 us, the lm_head 945 -> 540; RB 4
    spills) and K = 4096 keeps one with two chunks in flight (22.7 -> 20.8 us). From 9 to 32 rows two chunks in
    flight (16 rows: 12352 x 2048 12.72 -> 11.61 us, 2048 x 4096 12.86 -> 11.19; 32 rows: 12352 x 2048 24.66 (RB 2)
    -> 22.58), and for the lm_head (N / 16 >= 4096 row blocks) also two row blocks (16 rows 166.5 -> 146.9, 32 rows
    352.0 -> 334.5); up to 8 rows the one-row choice, with the register ring (AHEAD = chunks - 1) below
    RING_MAX_BLOCKS row blocks: after-norm sweep, one row, 12352 x 2048 9.45 -> 8.05 us, 9216 x 2048 8.78 -> 6.93,
    2048 x 4096 9.03 -> 7.16; 8 rows 10.82 -> 9.62, 10.60 -> 8.10, 8.92 -> 8.55; the lm_head's 15520 blocks keep
    AHEAD 1 (84.1 us; the ring 90.1 at one row, 106.0 at 8)."""
    warps = default_warps(k)
    two = nb is None or nb % 2 == 0
    if m <= 8:
        chunks = k // GROUP // warps
        ring = chunks - 1 >= 3 and (nb is None or nb < RING_MAX_BLOCKS)
        return warps, 1, chunks - 1 if ring else 1
    if m <= 32:
        return warps, 2 if (two and nb is not None and nb >= 4096) else 1, 2
    if k <= 2048 and two:
        return warps, 2, 1
    return warps, 1, 2


if HAVE_GLUON:
    # 8 codes of one word -> four bf16x2 registers (128 + code in each half), fragment order a0..a3; $4 is the
    # word (the pack of 8 hands the same word 8 times: the broadcast below), $0..$3 the outputs.
    _DEQUANT_ASM = gl.constexpr("""{
    .reg .b32 t;
    lop3.b32 $0, $4, 0x000f000f, 0x43004300, 0xea;
    shr.b32 t, $4, 4;
    lop3.b32 $1, t, 0x000f000f, 0x43004300, 0xea;
    shr.b32 t, $4, 8;
    lop3.b32 $2, t, 0x000f000f, 0x43004300, 0xea;
    shr.b32 t, $4, 12;
    lop3.b32 $3, t, 0x000f000f, 0x43004300, 0xea;
    }""")

    @gluon.jit
    def pdl_open(PDL: gl.constexpr):
        """triton_pdl.pdl_open for Gluon kernels (the same instruction; the same protocol, tests/test_pdl_protocol)."""
        if PDL:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)

    @gluon.jit
    def pdl_wait(PDL: gl.constexpr):
        """triton_pdl.pdl_wait for Gluon kernels, also a compiler memory barrier (no load moves across it: the
        predecessor's outputs are read after it, constant data requested before it stays there)."""
        if PDL:
            gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r,~{memory}", [], dtype=gl.int32,
                                      is_pure=False, pack=1)

    # The register layouts both kernels share (W warps splitting K, RB row blocks of 16 per program); the layouts
    # derived from them (dot operands, slices) are spelled where they are used.
    @gluon.constexpr_function
    def _mma_layout(W):
        return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1, 1], instr_shape=[1, 16, 8])

    @gluon.constexpr_function
    def _words_layout(W, RB):
        """words [W, RB, 8 rr, 4 c, 4 j] (one 128-bit load per thread, group and row block), broadcast over the 8
        codes (the trailing axis)."""
        return gl.BlockedLayout([1, RB, 1, 1, 4, 8], [1, 1, 8, 4, 1, 1], [W, 1, 1, 1, 1, 1], [5, 4, 3, 2, 1, 0])

    @gluon.constexpr_function
    def _x_layout(W):
        """x [W, N8, 4 c, 16]: thread (n, c) holds x[n, 64 g + 16 c : + 16]."""
        return gl.BlockedLayout([1, 1, 1, 16], [1, 8, 4, 1], [W, 1, 1, 1], [3, 2, 1, 0])

    @gluon.constexpr_function
    def _sb_layout(W, RB):
        """(s, b) [W, RB, 8 rr, 2 i1, 2]: the four lanes of a row group read the same 8 bytes."""
        return gl.BlockedLayout([1, RB, 1, 2, 2], [1, 1, 8, 4, 1], [W, 1, 1, 1, 1], [4, 3, 2, 1, 0])

    @gluon.jit
    def _offsets(W: gl.constexpr, RB: gl.constexpr, N8: gl.constexpr, WL: gl.constexpr, XL: gl.constexpr,
                 SL: gl.constexpr, CL: gl.constexpr, G: gl.constexpr, x_rows, xs_rows):
        """Offsets of chunk 0 (W groups, warp w: group w) for the words, x, (s, b) and xs tiles; chunk c adds
        c * W * (128, 64, 32, 1). Row block r of the program adds r * G * (128, -, 32, -). x_rows [N8] (layout
        _x_cols) and xs_rows [N8] (layout SliceLayout(0, CL)): the element offsets of the MMA columns' rows of x
        and of xs (column n is row n for a plain GEMV, a gathered token for the experts)."""
        wb = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, WL)))))
        wq = gl.arange(0, RB, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, WL)))))
        wr = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, gl.SliceLayout(4, WL)))))
        wc = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(4, WL)))))
        wj = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, WL)))))
        w_off = (wb[:, None, None, None, None] * 128 + wq[None, :, None, None, None] * (G * 128)
                 + wr[None, None, :, None, None] * 16 + wc[None, None, None, :, None] * 4 + wj[None, None, None, None, :])
        xb = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, XL))))
        xc = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, XL))))
        xe = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, XL))))
        x_off = (xb[:, None, None, None] * 64 + x_rows[None, :, None, None] + xc[None, None, :, None] * 16
                 + xe[None, None, None, :])
        sbb = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, SL)))))
        sbq = gl.arange(0, RB, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, SL)))))
        sbr = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, gl.SliceLayout(4, SL)))))
        sbh = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(4, SL)))))
        sbs = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, SL)))))
        sb_off = (sbb[:, None, None, None, None] * 32 + sbq[None, :, None, None, None] * (G * 32)
                  + sbr[None, None, :, None, None] * 4 + sbh[None, None, None, :, None] * 2
                  + sbs[None, None, None, None, :])
        cb = gl.arange(0, W, layout=gl.SliceLayout(1, CL))
        xs_off = cb[:, None] + xs_rows[None, :]
        return w_off, x_off, sb_off, xs_off

    @gluon.jit
    def _load_slices(w_base, sb_base, w2_base, sb2_base, w_off, sb_off, w_live, W: gl.constexpr,
                     NCH: gl.constexpr, MASKED: gl.constexpr, TWO: gl.constexpr):
        """The whole-slice form's loads: every chunk's words and (s, b) of the weight (and of the second one when
        TWO), all requested at once, as tuples indexed by chunk."""
        wt = ()
        sbt = ()
        wt2 = ()
        sbt2 = ()
        for c in gl.static_range(NCH):
            words, sb = _load_weight_chunk(w_base, sb_base, c, w_off, sb_off, w_live, W, MASKED)
            wt = wt + (words,)
            sbt = sbt + (sb,)
            if TWO:
                words2, sb2 = _load_weight_chunk(w2_base, sb2_base, c, w_off, sb_off, w_live, W, MASKED)
                wt2 = wt2 + (words2,)
                sbt2 = sbt2 + (sb2,)
        return wt, sbt, wt2, sbt2

    @gluon.jit
    def _accumulate_slices(acc, acc2, wt, sbt, wt2, sbt2, x_sm, xs_sm, zero_w, W: gl.constexpr, RB: gl.constexpr,
                           N8: gl.constexpr, NCH: gl.constexpr, mma: gl.constexpr, dot_a: gl.constexpr,
                           dot_b: gl.constexpr, XL: gl.constexpr, CL: gl.constexpr, TWO: gl.constexpr,
                           SELF_XS: gl.constexpr):
        """acc (+ acc2 from the second weight when TWO) + every chunk in order, from _load_slices' tuples and x
        staged by _stage_x (after its group wait): _accumulate's arithmetic."""
        for c in gl.static_range(NCH):
            xv, xs = _staged_chunk(x_sm, xs_sm, c, XL, CL, SELF_XS)
            acc = _chunk_acc(acc, wt[c], xv, sbt[c], xs, zero_w, W, RB, N8, mma, dot_a, dot_b, SELF_XS)
            if TWO:
                acc2 = _chunk_acc(acc2, wt2[c], xv, sbt2[c], xs, zero_w, W, RB, N8, mma, dot_a, dot_b, SELF_XS)
        return acc, acc2

    @gluon.jit
    def _load_weight_chunk(w_base, sb_base, c, w_off, sb_off, w_live, W: gl.constexpr, MASKED: gl.constexpr = True):
        """Chunk c's words and (s, b); MASKED: predicated on w_live (an expert tile with no rows reads nothing)."""
        if MASKED:
            words = gl.load(w_base + c * W * 128 + w_off, mask=w_live, other=0)
            sb = gl.load(sb_base + c * W * 32 + sb_off, mask=w_live, other=0.0)
        else:
            words = gl.load(w_base + c * W * 128 + w_off)
            sb = gl.load(sb_base + c * W * 32 + sb_off)
        return words, sb

    @gluon.jit
    def _silu_mul(g, u):
        """The MoE's hidden from fp32 copies of bf16 g and u: bf16(bf16(SiLU(g)) * u), SiLU as g / (1 + e^-g) in fp32
        (each step rounded as torch's bf16 ops). One formula for the gated epilogue, the split layout's pair and
        down's GLU load, so the three give the same bits by construction."""
        sg = (g / (1.0 + gl.exp(-g))).to(gl.bfloat16).to(gl.float32)
        return (sg * u).to(gl.bfloat16)

    @gluon.jit
    def _load_chunk(w_base, x_ptr, sb_base, xs_ptr, c, w_off, x_off, x_mask, sb_off, xs_off, xs_mask, w_live,
                    W: gl.constexpr, MASKED: gl.constexpr, SELF_XS: gl.constexpr = False, GLU: gl.constexpr = 0):
        """Chunk c's (words, x, (s, b), xs). MASKED: the weight loads too are predicated on w_live (an expert
        tile with no rows reads nothing). SELF_XS: no xs to load (_chunk_acc makes the group sums itself).
        GLU > 0: x's row holds (g, u) with u GLU elements after g, and the chunk's x is the MoE's hidden
        h = bf16(bf16(SiLU(g)) * u), the gated epilogue's arithmetic (_experts_store) on the same bf16 values."""
        if MASKED:
            words = gl.load(w_base + c * W * 128 + w_off, mask=w_live, other=0)
        else:
            words = gl.load(w_base + c * W * 128 + w_off)
        xv = _load_x_chunk(x_ptr, c, x_off, x_mask, W, GLU)
        if MASKED:
            sb = gl.load(sb_base + c * W * 32 + sb_off, mask=w_live, other=0.0)
        else:
            sb = gl.load(sb_base + c * W * 32 + sb_off)
        return words, xv, sb, _load_xs_chunk(xs_ptr, c, xs_off, xs_mask, W, SELF_XS)

    @gluon.jit
    def _load_x_chunk(x_ptr, c, x_off, x_mask, W: gl.constexpr, GLU: gl.constexpr):
        """Chunk c of x (GLU > 0: the MoE's hidden made from the (g, u) pair, as _load_chunk says)."""
        if GLU > 0:
            g = gl.load(x_ptr + c * W * 64 + x_off, mask=x_mask, other=0.0).to(gl.float32)
            u = gl.load(x_ptr + GLU + c * W * 64 + x_off, mask=x_mask, other=0.0).to(gl.float32)
            return _silu_mul(g, u)
        else:
            return gl.load(x_ptr + c * W * 64 + x_off, mask=x_mask, other=0.0)

    @gluon.jit
    def _load_xs_chunk(xs_ptr, c, xs_off, xs_mask, W: gl.constexpr, SELF_XS: gl.constexpr):
        """Chunk c of x's group sums (SELF_XS: none to load, _chunk_acc makes them)."""
        if SELF_XS:
            return 0.0
        else:
            return gl.load(xs_ptr + c * W + xs_off, mask=xs_mask, other=0.0)

    @gluon.jit
    def _accumulate(acc, first, w_base, x_ptr, sb_base, xs_ptr, w_off, x_off, x_mask, sb_off, xs_off, xs_mask,
                    w_live, zero_w, W: gl.constexpr, RB: gl.constexpr, N8: gl.constexpr, NCH: gl.constexpr,
                    AHEAD: gl.constexpr, MASKED: gl.constexpr, mma: gl.constexpr, dot_a: gl.constexpr,
                    dot_b: gl.constexpr, SELF_XS: gl.constexpr = False, GLU: gl.constexpr = 0):
        """acc + every chunk in order, chunk 0 being `first` (already loaded; GLU: _load_chunk's); AHEAD 1: chunk c + 1's loads are
        issued before chunk c is computed, AHEAD 2: chunks c + 1 and c + 2 are in flight while chunk c is computed
        (the bits are the same every way)."""
        words, xv, sb, xs = first
        if AHEAD == 2:
            n1 = _load_chunk(w_base, x_ptr, sb_base, xs_ptr, min(1, NCH - 1), w_off, x_off, x_mask, sb_off, xs_off,
                             xs_mask, w_live, W, MASKED, SELF_XS, GLU)
        for c in gl.static_range(NCH):
            if AHEAD == 2:
                nxt = _load_chunk(w_base, x_ptr, sb_base, xs_ptr, min(c + 2, NCH - 1), w_off, x_off, x_mask,
                                  sb_off, xs_off, xs_mask, w_live, W, MASKED, SELF_XS, GLU)
                acc = _chunk_acc(acc, words, xv, sb, xs, zero_w, W, RB, N8, mma, dot_a, dot_b, SELF_XS)
                words, xv, sb, xs = n1
                n1 = nxt
            elif AHEAD == 1:
                nxt = _load_chunk(w_base, x_ptr, sb_base, xs_ptr, min(c + 1, NCH - 1), w_off, x_off, x_mask,
                                  sb_off, xs_off, xs_mask, w_live, W, MASKED, SELF_XS, GLU)
                acc = _chunk_acc(acc, words, xv, sb, xs, zero_w, W, RB, N8, mma, dot_a, dot_b, SELF_XS)
                words, xv, sb, xs = nxt
            else:
                acc = _chunk_acc(acc, words, xv, sb, xs, zero_w, W, RB, N8, mma, dot_a, dot_b, SELF_XS)
                if c + 1 < NCH:
                    words, xv, sb, xs = _load_chunk(w_base, x_ptr, sb_base, xs_ptr, c + 1, w_off, x_off, x_mask,
                                                    sb_off, xs_off, xs_mask, w_live, W, MASKED, SELF_XS, GLU)
        return acc

    @gluon.jit
    def _chunk_acc(acc, words, xv, sb, xs, zero_w, W: gl.constexpr, RB: gl.constexpr, N8: gl.constexpr,
                   mma: gl.constexpr, dot_a: gl.constexpr, dot_b: gl.constexpr, SELF_XS: gl.constexpr = False):
        """acc + one chunk [W, 16 RB, N8] (warp w: its group's s * (q . x) + b * sum(x), as two FMAs in that order).
        SELF_XS: sum(x) is MMA(ones, x), the tensor core's fp32 sum of the column's 64 values (a fixed rounding
        of its own, per column like the product), instead of the loaded xs: no prep launch for x."""
        # the word's 8 codes as bf16 (128 + q), in the A fragment's register order (e = l + 2 i1 + 4 i2)
        w8 = gl.broadcast(gl.expand_dims(words, 5), zero_w)[0]
        q = gl.inline_asm_elementwise(_DEQUANT_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [w8], dtype=gl.bfloat16,
                                      is_pure=True, pack=8)
        q = gl.permute(gl.reshape(q, [W, RB, 8, 4, 4, 2, 2, 2]), [0, 1, 6, 2, 4, 5, 3, 7])  # w r i1 rr | j i2 c l
        a = gl.convert_layout(gl.reshape(q, [W, RB * 16, 64]), dot_a, assert_trivial=True)
        xr = gl.permute(gl.reshape(xv, [W, N8, 4, 4, 2, 2]), [0, 3, 4, 2, 5, 1])  # w | j i2 c l | n
        bx = gl.convert_layout(gl.reshape(xr, [W, 64, N8]), dot_b, assert_trivial=True)
        qx = mma_v2(a, bx, gl.zeros([W, RB * 16, N8], gl.float32, layout=mma))
        s, b = gl.split(sb.to(gl.float32))
        s = gl.convert_layout(gl.reshape(gl.permute(s, [0, 1, 3, 2]), [W, RB * 16]), gl.SliceLayout(2, mma),
                              assert_trivial=True)
        b = gl.convert_layout(gl.reshape(gl.permute(b, [0, 1, 3, 2]), [W, RB * 16]), gl.SliceLayout(2, mma),
                              assert_trivial=True)
        b128 = gl.fma(s, -128.0, b)  # b - 128 s: the codes came in as 128 + q
        acc = gl.fma(s[:, :, None], qx, acc)
        if SELF_XS:
            ones = gl.full([W, RB * 16, 64], 1.0, gl.bfloat16, layout=dot_a)
            xsum = mma_v2(ones, bx, gl.zeros([W, RB * 16, N8], gl.float32, layout=mma))
            acc = gl.fma(b128[:, :, None], xsum, acc)
        else:
            acc = gl.fma(b128[:, :, None], xs[:, None, :], acc)
        return acc

    @gluon.jit
    def _conv_epilogue(total, out_ptr, stride_om, f, o_n, M, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C,
                       stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk, KCONV: gl.constexpr):
        """The DeltaNet decode conv on the program's output tile (gated_delta.triton_decode.conv_epilogue's
        arithmetic, here with features f [R] as rows and tokens o_n [N8] as columns): y = the projection rounded
        to the activation dtype; features < C get SiLU(sum_j w[f, j] [state ; y]_j) (fp32, j = 0 .. KCONV-1 from
        zero, as _conv_kernel) and shift their pool window (oldest dropped, y appended); the rest store y. A layout
        may hold an element in several threads (small tiles wrap), so reads and writes of the pool are separated
        by block barriers; Triton stores a replicated value once."""
        act = out_ptr.dtype.element_ty
        y = total.to(act)
        live = o_n < M
        nn = gl.minimum(o_n, M - 1)
        slot = gl.load(slot_ptr + nn).to(gl.int64)
        keep = gl.load(ctx_ptr + nn) != 0
        is_c = f < C
        c_mask = is_c[:, None] & (o_n >= 0)[None, :]
        st = pool_ptr + slot[None, :] * stride_ps + f[:, None] * stride_pc
        conv = gl.zeros_like(total)  # total is fp32
        for j in gl.static_range(KCONV - 1):
            sv = gl.load(st + j * stride_pk, mask=c_mask & keep[None, :], other=0.0)
            wj = gl.load(cw_ptr + f * stride_cwc + j * stride_cwk, mask=is_c, other=0.0).to(gl.float32)
            conv += sv.to(gl.float32) * wj[:, None]
        wl = gl.load(cw_ptr + f * stride_cwc + (KCONV - 1) * stride_cwk, mask=is_c, other=0.0).to(gl.float32)
        conv += y.to(gl.float32) * wl[:, None]
        conv = conv / (1.0 + gl.exp(-conv))  # SiLU as torch writes it (and _conv_kernel), x / (1 + e^-x)
        res = gl.where(is_c[:, None], conv.to(act), y)
        gl.store(out_ptr + o_n[None, :].to(gl.int64) * stride_om + f[:, None], res, mask=live[None, :])
        upd = c_mask & live[None, :]
        for j in gl.static_range(KCONV - 2):
            nxt = gl.load(st + (j + 1) * stride_pk, mask=c_mask & keep[None, :], other=0.0)
            gl.thread_barrier()
            gl.store(st + j * stride_pk, nxt, mask=upd)
        gl.thread_barrier()
        gl.store(st + (KCONV - 2) * stride_pk, y.to(pool_ptr.dtype.element_ty), mask=upd)

    @gluon.jit
    def _stage_x(x_ptr, xs_ptr, x_off, x_mask, xs_off, xs_mask, W: gl.constexpr, N8: gl.constexpr,
                 NCH: gl.constexpr, SELF_XS: gl.constexpr):
        """x (and its group sums unless SELF_XS) of every chunk into shared memory by cp.async, all requested as one
        group (the caller waits for it): a register load would be sunk by ptxas to its chunk's MMAs, one L2 latency
        per chunk. Each thread reads back (_staged_chunk) only what it copied, in the same layouts."""
        SH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[3, 2, 1, 0])  # per chunk
        x_sm = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [NCH, W, N8, 4, 16], SH)
        full_mask = gl.broadcast(x_mask, x_off)[0]
        for c in gl.static_range(NCH):
            async_copy.async_copy_global_to_shared(x_sm.index(c), x_ptr + c * W * 64 + x_off, mask=full_mask)
        xs_sm = x_sm
        if not SELF_XS:
            SH2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
            xs_sm = gl.allocate_shared_memory(gl.float32, [NCH, W, N8], SH2)
            xs_full = gl.broadcast(xs_mask, xs_off)[0]
            for c in gl.static_range(NCH):
                async_copy.async_copy_global_to_shared(xs_sm.index(c), xs_ptr + c * W + xs_off, mask=xs_full)
        async_copy.commit_group()
        return x_sm, xs_sm

    @gluon.jit
    def _staged_chunk(x_sm, xs_sm, c: gl.constexpr, XL: gl.constexpr, CL: gl.constexpr, SELF_XS: gl.constexpr):
        """Chunk c's (x, xs) from _stage_x's buffers (after the group wait)."""
        xv = x_sm.index(c).load(XL)
        if SELF_XS:
            xs = 0.0
        else:
            xs = xs_sm.index(c).load(CL)
        return xv, xs

    @gluon.jit
    def _mma_gemv_kernel(x_ptr, xs_ptr, w_ptr, sb_ptr, out_ptr, M, stride_xm, stride_sm, stride_om,
                         cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C, stride_cwc, stride_cwk, stride_ps, stride_pc,
                         stride_pk, K: gl.constexpr, W: gl.constexpr, RB: gl.constexpr, NT: gl.constexpr,
                         AHEAD: gl.constexpr, CONV: gl.constexpr = False, KCONV: gl.constexpr = 4,
                         PDL: gl.constexpr = False, SELF_XS: gl.constexpr = False, SPLIT: gl.constexpr = False):
        """grid (N / (16 RB),): out[:M, rows of the program] = x[:M] W^T; xs [M, K / 64] fp32 the group sums of x
        (triton_gemv.prep_row's, so the bits of every path that makes them agree). Chunk c is groups c W .. c W +
        W - 1, warp w taking group c W + w; a warp adds its chunks in order, the warps' sums are added last.
        AHEAD: chunks c + 1 .. c + AHEAD are requested before chunk c is computed (3 .. NCH - 1: the register ring,
        _accumulate_ring, its first chunks' weights before the PDL wait; AHEAD >= NCH: every chunk at once, the
        weight's before the PDL wait, x staged in shared memory; registers for all of them, so for a few rows of x
        only). RB and
        AHEAD never change bits; W does. PDL (kernels/triton_pdl.py's protocol): the first chunk's weights are
        requested before the wait for the previous kernel, x and xs after it. CONV: the DeltaNet decode conv on
        features < C (_conv_epilogue; the pool arguments are unused otherwise). SELF_XS: the group sums of x are
        the kernel's own (_chunk_acc), xs_ptr is not read. SPLIT: grid (N / (16 RB), row blocks of x), program
        (p, r) taking rows [8 NT r, 8 NT (r + 1)) of x (rows are MMA columns: never a bit; not with CONV)."""
        pdl_open(PDL)
        G: gl.constexpr = K // 64
        NCH: gl.constexpr = G // W
        N8: gl.constexpr = 8 * NT  # MMA columns (rows of x, padded)
        pid = gl.program_id(0).to(gl.int64)
        if SPLIT:
            gl.static_assert(not CONV, "the row split takes no conv epilogue")
            r0 = gl.program_id(1) * N8
            x_ptr += r0.to(gl.int64) * stride_xm
            xs_ptr += r0.to(gl.int64) * stride_sm
            out_ptr += r0.to(gl.int64) * stride_om
            M -= r0

        mma: gl.constexpr = _mma_layout(W)
        dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        dot_b: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
        WL8: gl.constexpr = _words_layout(W, RB)
        WL: gl.constexpr = gl.SliceLayout(5, WL8)
        XL: gl.constexpr = _x_layout(W)
        SL: gl.constexpr = _sb_layout(W, RB)
        CL: gl.constexpr = gl.SliceLayout(1, mma)  # xs [W, N8]: per group (warp) and column
        OL: gl.constexpr = gl.SliceLayout(0, mma)

        xn = gl.arange(0, N8, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, XL))))
        cn = gl.arange(0, N8, layout=gl.SliceLayout(0, CL))
        w_off, x_off, sb_off, xs_off = _offsets(W, RB, N8, WL, XL, SL, CL, G, xn * stride_xm, cn * stride_sm)
        x_mask = (xn < M)[None, :, None, None]
        xs_mask = (cn < M)[None, :]
        w_base = w_ptr + pid * RB * G * 128
        sb_base = sb_ptr + pid * RB * G * 32
        zero_w = gl.zeros([W, RB, 8, 4, 4, 8], gl.int32, layout=WL8)
        acc = gl.zeros([W, RB * 16, N8], gl.float32, layout=mma)
        if AHEAD >= NCH:
            # every chunk in flight at once: all the weight's words and (s, b) requested first (before the wait for
            # the previous kernel under PDL, which also keeps ptxas from sinking them to their use), then all of x
            wt, sbt, wt2, sbt2 = _load_slices(w_base, sb_base, w_base, sb_base, w_off, sb_off, True, W, NCH, False,
                                              False)
            pdl_wait(PDL)
            x_sm, xs_sm = _stage_x(x_ptr, xs_ptr, x_off, x_mask, xs_off, xs_mask, W, N8, NCH, SELF_XS)
            async_copy.wait_group(0)
            acc, _ = _accumulate_slices(acc, acc, wt, sbt, wt2, sbt2, x_sm, xs_sm, zero_w, W, RB, N8, NCH, mma, dot_a,
                                        dot_b, XL, CL, False, SELF_XS)
        elif AHEAD > 2:
            acc, _ = _accumulate_ring(acc, acc, w_base, w_base, x_ptr, sb_base, sb_base, xs_ptr, w_off, x_off, x_mask,
                                      sb_off, xs_off, xs_mask, True, zero_w, W, RB, N8, NCH, mma, dot_a, dot_b, AHEAD,
                                      False, SELF_XS, 0, PDL, False)
        else:  # AHEAD 1 or 2 below the chunk count (a weight of one or two chunks per warp took the branch above)
            if PDL:
                words, sb = _load_weight_chunk(w_base, sb_base, 0, w_off, sb_off, True, W, False)  # constant first
                pdl_wait(PDL)
                first = (words, _load_x_chunk(x_ptr, 0, x_off, x_mask, W, 0), sb,
                         _load_xs_chunk(xs_ptr, 0, xs_off, xs_mask, W, SELF_XS))
            else:
                first = _load_chunk(w_base, x_ptr, sb_base, xs_ptr, 0, w_off, x_off, x_mask, sb_off, xs_off,
                                    xs_mask, True, W, False, SELF_XS)
            acc = _accumulate(acc, first, w_base, x_ptr, sb_base, xs_ptr, w_off, x_off, x_mask, sb_off, xs_off,
                              xs_mask, True, zero_w, W, RB, N8, NCH, AHEAD, False, mma, dot_a, dot_b, SELF_XS)
        total = gl.sum(acc, axis=0)
        o_row = gl.arange(0, RB * 16, layout=gl.SliceLayout(1, OL))
        o_n = gl.arange(0, N8, layout=gl.SliceLayout(0, OL))
        if CONV:
            # the conv on the tile spread over the warps (the cross-warp sum leaves all of it in every warp: at 64
            # rows of x and RB 2 that replicated epilogue spilled); elementwise, so the layout changes no value
            EL: gl.constexpr = gl.BlockedLayout([1, 1], [8, 4], [1, W], [0, 1])
            tot = gl.convert_layout(total, EL)
            e_row = gl.arange(0, RB * 16, layout=gl.SliceLayout(1, EL))
            e_n = gl.arange(0, N8, layout=gl.SliceLayout(0, EL))
            _conv_epilogue(tot, out_ptr, stride_om, pid * RB * 16 + e_row, e_n, M, cw_ptr, pool_ptr, slot_ptr,
                           ctx_ptr, C, stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk, KCONV)
        else:
            o_ptr = out_ptr + o_n[None, :].to(gl.int64) * stride_om + pid * RB * 16 + o_row[:, None]
            # rounded to bf16 first whatever out holds: an fp32 out (the lm_head's logits) gets the bf16 values
            # widened, the bits of a bf16 out then .float(), without that launch
            gl.store(o_ptr, total.to(gl.bfloat16).to(out_ptr.dtype.element_ty), mask=(o_n < M)[None, :])


    @gluon.jit
    def _arrival(cnt):
        """triton_sync.last_arrival's protocol for Gluon kernels, up to the test: every thread's stores before the
        release (block barrier), then an acq_rel atomic at GPU scope on the group's counter; returns the count
        before this program's arrival (the last of n sees n - 1 and resets the counter to 0)."""
        gl.thread_barrier()
        return gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")

    @gluon.jit
    def _combine_at_last_arrival(part_ptr, res_ptr, comb_ptr, cnt_ptr, t, col, rb, ncols, stride_pm, stride_rm,
                                 stride_cm, W: gl.constexpr, RB: gl.constexpr, SLOTS: gl.constexpr,
                                 HAS_RES: gl.constexpr):
        """After this program stored part row t (= SLOTS * token + slot), features [16 rb, 16 rb + 16 RB): the
        last of the token's SLOTS programs of this column combines them (triton_sync.last_arrival's protocol:
        block barrier, acq_rel atomic at GPU scope, the counter reset by the last; parts re-read with .cg)."""
        tok = t // SLOTS
        cnt = cnt_ptr + tok * ncols + col
        if _arrival(cnt) == SLOTS - 1:
            gl.store(cnt, 0)
            FL: gl.constexpr = gl.BlockedLayout([1], [32], [W], [0])
            f = rb * 16 + gl.arange(0, RB * 16, layout=FL)
            base = part_ptr + (tok * SLOTS).to(gl.int64) * stride_pm + f
            acc = gl.load(base, cache_modifier=".cg")
            for s in gl.static_range(1, SLOTS):
                acc += gl.load(base + s * stride_pm, cache_modifier=".cg")
            o_ty = comb_ptr.dtype.element_ty
            y = acc.to(o_ty)
            if HAS_RES:
                r = gl.load(res_ptr + tok.to(gl.int64) * stride_rm + f)
                y = (r.to(gl.float32) + y.to(gl.float32)).to(o_ty)
            gl.store(comb_ptr + tok.to(gl.int64) * stride_cm + f, y)


    @gluon.jit
    def _glu_at_last_arrival(gu_ptr, h_ptr, cnt_ptr, t, rb, o_dst, o_row, o_mask, stride_om, stride_hm,
                             PAIR: gl.constexpr):
        """After this program stored its 16 rows of g (row block rb < PAIR) or u (rb >= PAIR) for tile t's rows: the
        second of the pair (rb mod PAIR) re-reads both (.cg, after triton_sync.last_arrival's acq_rel protocol)
        and stores h = bf16(bf16(SiLU(g)) * u), the gated epilogue's arithmetic (_experts_store) on the same bf16
        values, into h rows o_dst, features 16 (rb mod PAIR) + [0, 16)."""
        r = rb % PAIR
        cnt = cnt_ptr + t * PAIR + r
        if _arrival(cnt) == 1:
            gl.store(cnt, 0)
            g_ptr = gu_ptr + o_dst[None, :] * stride_om + r * 16 + o_row[:, None]
            g = gl.load(g_ptr, mask=o_mask, other=0.0, cache_modifier=".cg").to(gl.float32)
            u = gl.load(g_ptr + PAIR * 16, mask=o_mask, other=0.0, cache_modifier=".cg").to(gl.float32)
            gl.store(h_ptr + o_dst[None, :] * stride_hm + r * 16 + o_row[:, None], _silu_mul(g, u), mask=o_mask)

    @gluon.jit
    def _accumulate_pair(acc, acc2, w_base, w2_base, x_ptr, sb_base, sb2_base, xs_ptr, w_off, x_off, x_mask,
                         sb_off, xs_off, xs_mask, w_live, zero_w, W: gl.constexpr, RB: gl.constexpr,
                         N8: gl.constexpr, NCH: gl.constexpr, mma: gl.constexpr, dot_a: gl.constexpr,
                         dot_b: gl.constexpr, AHEAD: gl.constexpr = 1, SELF_XS: gl.constexpr = False):
        """_accumulate (MASKED; AHEAD 1 or 2 chunks in flight) over two weights sharing every x chunk: acc from w,
        acc2 from w2, each with exactly _accumulate's arithmetic (so each equals that weight's plain result bit for
        bit)."""
        words, xv, sb, xs = _load_chunk(w_base, x_ptr, sb_base, xs_ptr, 0, w_off, x_off, x_mask, sb_off, xs_off,
                                        xs_mask, w_live, W, True, SELF_XS)
        words2, sb2 = _load_weight_chunk(w2_base, sb2_base, 0, w_off, sb_off, w_live, W)
        if AHEAD == 2:
            n1 = _load_chunk(w_base, x_ptr, sb_base, xs_ptr, min(1, NCH - 1), w_off, x_off, x_mask, sb_off, xs_off,
                             xs_mask, w_live, W, True, SELF_XS)
            n1w = _load_weight_chunk(w2_base, sb2_base, min(1, NCH - 1), w_off, sb_off, w_live, W)
        for c in gl.static_range(NCH):
            nc = min(c + AHEAD, NCH - 1)
            nxt = _load_chunk(w_base, x_ptr, sb_base, xs_ptr, nc, w_off, x_off, x_mask, sb_off, xs_off, xs_mask,
                              w_live, W, True, SELF_XS)
            nxt2 = _load_weight_chunk(w2_base, sb2_base, nc, w_off, sb_off, w_live, W)
            acc = _chunk_acc(acc, words, xv, sb, xs, zero_w, W, RB, N8, mma, dot_a, dot_b, SELF_XS)
            acc2 = _chunk_acc(acc2, words2, xv, sb2, xs, zero_w, W, RB, N8, mma, dot_a, dot_b, SELF_XS)
            if AHEAD == 2:
                words, xv, sb, xs = n1
                words2, sb2 = n1w
                n1 = nxt
                n1w = nxt2
            else:
                words, xv, sb, xs = nxt
                words2, sb2 = nxt2
        return acc, acc2

    @gluon.jit
    def _accumulate_ring(acc, acc2, w_base, w2_base, x_ptr, sb_base, sb2_base, xs_ptr, w_off, x_off, x_mask, sb_off,
                         xs_off, xs_mask, w_live, zero_w, W: gl.constexpr, RB: gl.constexpr, N8: gl.constexpr,
                         NCH: gl.constexpr, mma: gl.constexpr, dot_a: gl.constexpr, dot_b: gl.constexpr,
                         AHEAD: gl.constexpr, TWO: gl.constexpr, SELF_XS: gl.constexpr = False,
                         GLU: gl.constexpr = 0, PDL_WAIT: gl.constexpr = False, MASKED: gl.constexpr = True):
        """_accumulate / _accumulate_pair (MASKED) with AHEAD (3 .. NCH - 1) chunks in flight, all in registers:
        chunks 0 .. AHEAD - 1 (x, words, scales, each chunk's in turn) are requested first, then chunk c + AHEAD
        before chunk c is computed, so AHEAD = NCH - 1 requests the whole slice up front in chunk order with x
        beside its words (the AHEAD >= NCH form stages x through shared memory after every weight, and its
        barrier waits for the last of them: ncu at T = 1, lab/NOTES.md). The same arithmetic in the same order:
        the same bits as every other AHEAD. PDL_WAIT (one weight; the caller launched with PDL and has not waited
        yet, tests/test_pdl_protocol): the first AHEAD chunks' words and scales (constant data) are requested, then
        the wait for the previous kernel, then their x. MASKED: the weight loads are predicated on w_live."""
        wt = ()
        xt = ()
        sbt = ()
        xst = ()
        wt2 = ()
        sbt2 = ()
        if PDL_WAIT:
            gl.static_assert(not TWO, "the early wait's first chunks are one weight's")
            wt, sbt, _, _ = _load_slices(w_base, sb_base, w_base, sb_base, w_off, sb_off, w_live, W, AHEAD, MASKED,
                                         False)
            pdl_wait(PDL_WAIT)
            for c in gl.static_range(AHEAD):
                xt = xt + (_load_x_chunk(x_ptr, c, x_off, x_mask, W, GLU),)
                xst = xst + (_load_xs_chunk(xs_ptr, c, xs_off, xs_mask, W, SELF_XS),)
        for c in gl.static_range(NCH + AHEAD):
            if PDL_WAIT and c < AHEAD:
                pass  # requested above
            elif c < NCH:  # request chunk c
                words, xv, sb, xs = _load_chunk(w_base, x_ptr, sb_base, xs_ptr, c, w_off, x_off, x_mask, sb_off,
                                                xs_off, xs_mask, w_live, W, MASKED, SELF_XS, GLU)
                wt = wt + (words,)
                xt = xt + (xv,)
                sbt = sbt + (sb,)
                xst = xst + (xs,)
                if TWO:
                    words2, sb2 = _load_weight_chunk(w2_base, sb2_base, c, w_off, sb_off, w_live, W)
                    wt2 = wt2 + (words2,)
                    sbt2 = sbt2 + (sb2,)
            if c >= AHEAD:  # compute chunk c - AHEAD
                acc = _chunk_acc(acc, wt[c - AHEAD], xt[c - AHEAD], sbt[c - AHEAD], xst[c - AHEAD], zero_w, W, RB, N8,
                                 mma, dot_a, dot_b, SELF_XS)
                if TWO:
                    acc2 = _chunk_acc(acc2, wt2[c - AHEAD], xt[c - AHEAD], sbt2[c - AHEAD], xst[c - AHEAD], zero_w, W,
                                      RB, N8, mma, dot_a, dot_b, SELF_XS)
        return acc, acc2

    @gluon.jit
    def _mma_experts_kernel(x_ptr, xs_ptr, w_ptr, sb_ptr, w2_ptr, sb2_ptr, out_ptr, scale_ptr, tile_e_ptr, lo_ptr,
                            hi_ptr, order_ptr, stride_xm, stride_sm, stride_om, NBE, res_ptr, comb_ptr, cnt_ptr,
                            stride_rm, stride_cm, XREP: gl.constexpr, K: gl.constexpr, W: gl.constexpr,
                            NT: gl.constexpr, RB: gl.constexpr, SINGLE: gl.constexpr, GATED: gl.constexpr,
                            SCALED: gl.constexpr, PDL: gl.constexpr = False, SELF_XS: gl.constexpr = False,
                            COMBINE: gl.constexpr = False, SLOTS: gl.constexpr = 1, HAS_RES: gl.constexpr = False,
                            AHEAD: gl.constexpr = 1, LOOP: gl.constexpr = 1, GLU: gl.constexpr = 0,
                            PAIR: gl.constexpr = 0, OPEN_LATE: gl.constexpr = False, EARLY: gl.constexpr = False,
                            WSTAGE: gl.constexpr = 0, SKIP_EMPTY: gl.constexpr = True):
        """grid (tiles, N / (16 RB LOOP)): the plain kernel's arithmetic on expert tile t, row blocks
        [RB LOOP p, RB LOOP (p + 1)) of its expert: LOOP rounds of RB blocks held in registers together (the x
        columns are loaded once for the RB blocks; LOOP > 1 stages them in shared memory once for every round, so
        x is read from L2 once per LOOP RB blocks without RB's registers). A tile is sorted rows
        [lo, hi) of expert tile_e[t] (<= 8 NT of them), sorted row i being output row order[i] and input row
        order[i] // XREP; SINGLE: tile t is row t alone, of expert tile_e[t] (the ids themselves: no table). A
        tile of expert -1 reads and writes nothing. Epilogues, per output element y (fp32):
          plain   out = y rounded to out's dtype;
          GATED   (w2 the up projection at the same rows) out = bf16(bf16(SiLU(bf16 y)) * bf16 y2), SiLU as
                  x / (1 + e^-x) in fp32 (the MoE's h = SiLU(gate) * up, each step rounded as torch's bf16 ops);
          SCALED  out (fp32) = scale[row] * bf16(y) (a routed slot's contribution before the combine).
        Each output row is its own MMA column: its bits depend on (K, W) only, never on which rows share the
        expert, the tile or the launch. SELF_XS: x's group sums are the kernel's own (_chunk_acc), xs_ptr unread.
        AHEAD: chunks requested ahead of the one computed (3 .. NCH - 1: a register ring, _accumulate_ring; NCH - 1
        is the whole slice in chunk order); >= NCH: every chunk of the weight(s) at once, x through shared memory
        (_stage_x), the same arithmetic in the same order.
        WSTAGE >= 2 (LOOP 1, not GLU / PAIR / EARLY): the weight words through a ring of WSTAGE shared-memory slots
        filled by cp.async, WSTAGE - 1 chunks in flight without holding registers, x staged whole (_stage_x), the
        scales in registers (_accumulate_wstaged): the same arithmetic in the same order (AHEAD unused).
        COMBINE (SINGLE and SCALED, rows t = SLOTS * token + slot): the program that stores the last of a token's
        SLOTS parts of its row blocks (triton_sync's last arrival, one counter per (token, program column) at
        cnt_ptr) also does triton_combine.combine_slots' arithmetic on them: the slots added 0 .. SLOTS-1 in fp32
        (re-read from L2), rounded to comb's dtype, then + residual (HAS_RES) rounded once, into comb [T, N].
        GLU > 0 (not GATED, LOOP 1, AHEAD < NCH): x rows are (g, u) pairs, u GLU elements after g, and the kernel's
        input is h = bf16(bf16(SiLU(g)) * u), made at load (_load_chunk): the down projection after a gate/up run
        as one plain launch over the stacked [gate; up] weight, with the gated epilogue's bits.
        PAIR > 0 (plain, RB 1, LOOP 1; the weight's first PAIR row blocks gate, the next PAIR up): out gets g | u and
        the second program of each (gate, up) block pair also stores h = SiLU(g) * u for its 16 features into
        comb (row stride stride_cm; _glu_at_last_arrival, counters t * PAIR + block): the gated launch's bits.
        OPEN_LATE: the next launch may start only once every program here has passed its PDL wait (so the routing
        this launch waited for is complete when it starts). EARLY (SINGLE, the register ring, one weight; the
        launch before opened late): the expert id (from L2, ".cg") and the first AHEAD chunks' weights are read
        before the PDL wait, x after it: the same loads and arithmetic, the same bits."""
        if not OPEN_LATE:
            pdl_open(PDL)
        G: gl.constexpr = K // 64
        NCH: gl.constexpr = G // W
        N8: gl.constexpr = 8 * NT
        t = gl.program_id(0)
        rb = gl.program_id(1).to(gl.int64) * (RB * LOOP)

        mma: gl.constexpr = _mma_layout(W)
        dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        dot_b: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
        WL8: gl.constexpr = _words_layout(W, RB)
        WL: gl.constexpr = gl.SliceLayout(5, WL8)
        XL: gl.constexpr = _x_layout(W)
        SL: gl.constexpr = _sb_layout(W, RB)
        CL: gl.constexpr = gl.SliceLayout(1, mma)  # xs [W, N8]: per group (warp) and column
        OL: gl.constexpr = gl.SliceLayout(0, mma)

        if EARLY:  # the ids: complete since this launch started (the one before opened late)
            e = gl.load(tile_e_ptr + t, cache_modifier=".cg")
        else:
            pdl_wait(PDL)  # the tile table (or the ids) and x are the previous launches' output
            e = gl.load(tile_e_ptr + t)
        if OPEN_LATE:
            pdl_open(PDL)
        xn = gl.arange(0, N8, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, XL))))
        cn = gl.arange(0, N8, layout=gl.SliceLayout(0, CL))
        o_row = gl.arange(0, RB * 16, layout=gl.SliceLayout(1, OL))
        o_n = gl.arange(0, N8, layout=gl.SliceLayout(0, OL))
        if SINGLE:
            rows = gl.where(e >= 0, 1, 0)
            x_tok = (t + xn) // XREP
            s_tok = (t + cn) // XREP
            o_dst = (t + o_n).to(gl.int64)
        else:
            lo = gl.load(lo_ptr + t)
            rows = gl.where(e >= 0, gl.load(hi_ptr + t) - lo, 0)
            x_tok = gl.load(order_ptr + lo + xn, mask=xn < rows, other=0) // XREP
            s_tok = gl.load(order_ptr + lo + cn, mask=cn < rows, other=0) // XREP
            o_dst = gl.load(order_ptr + lo + o_n, mask=o_n < rows, other=0).to(gl.int64)
        live = rows > 0
        e64 = gl.maximum(e, 0).to(gl.int64)
        w_off, x_off, sb_off, xs_off = _offsets(W, RB, N8, WL, XL, SL, CL, G, x_tok.to(gl.int64) * stride_xm,
                                                s_tok.to(gl.int64) * stride_sm)
        x_mask = (xn < rows)[None, :, None, None]
        xs_mask = (cn < rows)[None, :]
        w_base = w_ptr + (e64 * NBE + rb) * G * 128
        sb_base = sb_ptr + (e64 * NBE + rb) * G * 32
        zero_w = gl.zeros([W, RB, 8, 4, 4, 8], gl.int32, layout=WL8)
        acc = gl.zeros([W, RB * 16, N8], gl.float32, layout=mma)
        o_mask = (o_n < rows)[None, :]
        o_ptr = out_ptr + o_dst[None, :] * stride_om + rb * 16 + o_row[:, None]
        w2_base = w2_ptr + (e64 * NBE + rb) * G * 128
        sb2_base = sb2_ptr + (e64 * NBE + rb) * G * 32
        acc2 = gl.zeros([W, RB * 16, N8], gl.float32, layout=mma)
        # the table's unused tail tiles (expert -1: ~16% of the 8-row tiles at 512 tokens) skip the work; single
        # rows, pair and combine launches run it for every program (their arrival counters count them all)
        if (rows > 0) | SINGLE | (PAIR > 0) | COMBINE | (not SKIP_EMPTY):
            if LOOP > 1:
                x_sm, xs_sm = _stage_x(x_ptr, xs_ptr, x_off, x_mask, xs_off, xs_mask, W, N8, NCH, SELF_XS)
                async_copy.wait_group(0)
                for r in range(LOOP):
                    rbr = rb + r * RB
                    acc, acc2 = _accumulate_staged(
                        gl.zeros([W, RB * 16, N8], gl.float32, layout=mma), gl.zeros([W, RB * 16, N8], gl.float32,
                                                                                     layout=mma),
                        w_ptr + (e64 * NBE + rbr) * G * 128, sb_ptr + (e64 * NBE + rbr) * G * 32,
                        w2_ptr + (e64 * NBE + rbr) * G * 128, sb2_ptr + (e64 * NBE + rbr) * G * 32, x_sm, xs_sm, w_off,
                        sb_off, live, zero_w, W, RB, N8, NCH, mma, dot_a, dot_b, XL, CL, GATED, SELF_XS)
                    _experts_store(acc, acc2, out_ptr + o_dst[None, :] * stride_om + rbr * 16 + o_row[:, None], o_mask,
                                   scale_ptr, o_dst, o_n < rows, GATED, SCALED)
            elif WSTAGE > 0:
                gl.static_assert(WSTAGE >= 2 and GLU == 0 and PAIR == 0 and not EARLY,
                                 "the staged weight ring: 2+ slots, a plain x and no pair / early forms")
                acc, acc2 = _accumulate_wstaged(acc, acc2, w_base, sb_base, w2_base, sb2_base, x_ptr, xs_ptr, w_off,
                                                sb_off, x_off, x_mask, xs_off, xs_mask, live, zero_w, W, RB, N8, NCH,
                                                WSTAGE, mma, dot_a, dot_b, WL, XL, CL, GATED, SELF_XS)
            elif AHEAD >= NCH:
                # the whole weight slice (both weights when GATED) requested at once, after the wait (the expert comes
                # from the routing); a second griddepcontrol.wait, which returns at once, keeps ptxas from sinking them
                # to their chunks' MMAs; x through shared memory (_stage_x)
                wt, sbt, wt2, sbt2 = _load_slices(w_base, sb_base, w2_base, sb2_base, w_off, sb_off, live, W, NCH, True,
                                                  GATED)
                x_sm, xs_sm = _stage_x(x_ptr, xs_ptr, x_off, x_mask, xs_off, xs_mask, W, N8, NCH, SELF_XS)
                pdl_wait(PDL)
                async_copy.wait_group(0)
                acc, acc2 = _accumulate_slices(acc, acc2, wt, sbt, wt2, sbt2, x_sm, xs_sm, zero_w, W, RB, N8, NCH, mma,
                                               dot_a, dot_b, XL, CL, GATED, SELF_XS)
            elif AHEAD > 2:
                acc, acc2 = _accumulate_ring(acc, acc2, w_base, w2_base, x_ptr, sb_base, sb2_base, xs_ptr, w_off, x_off,
                                             x_mask, sb_off, xs_off, xs_mask, live, zero_w, W, RB, N8, NCH, mma, dot_a,
                                             dot_b, AHEAD, GATED, SELF_XS, GLU, EARLY and PDL)
            elif GATED:
                acc, acc2 = _accumulate_pair(acc, acc2, w_base, w2_base, x_ptr, sb_base, sb2_base, xs_ptr, w_off, x_off,
                                             x_mask, sb_off, xs_off, xs_mask, live, zero_w, W, RB, N8, NCH, mma, dot_a,
                                             dot_b, AHEAD, SELF_XS)
            else:
                first = _load_chunk(w_base, x_ptr, sb_base, xs_ptr, 0, w_off, x_off, x_mask, sb_off, xs_off, xs_mask,
                                    live, W, True, SELF_XS, GLU)
                acc = _accumulate(acc, first, w_base, x_ptr, sb_base, xs_ptr, w_off, x_off, x_mask, sb_off, xs_off,
                                  xs_mask, live, zero_w, W, RB, N8, NCH, AHEAD, True, mma, dot_a, dot_b, SELF_XS, GLU)
            if LOOP == 1:
                _experts_store(acc, acc2, o_ptr, o_mask, scale_ptr, o_dst, o_n < rows, GATED, SCALED)
        if PAIR > 0:
            _glu_at_last_arrival(out_ptr, comb_ptr, cnt_ptr, t, rb, o_dst, o_row, o_mask, stride_om, stride_cm, PAIR)
        if COMBINE:
            _combine_at_last_arrival(out_ptr, res_ptr, comb_ptr, cnt_ptr, t, gl.program_id(1), rb, gl.num_programs(1),
                                     stride_om, stride_rm, stride_cm, W, RB * LOOP, SLOTS, HAS_RES)

    @gluon.jit
    def _experts_store(acc, acc2, o_ptr, o_mask, scale_ptr, o_dst, col_live, GATED: gl.constexpr,
                       SCALED: gl.constexpr):
        """The experts kernel's epilogue on one round of row blocks (the forms of its docstring)."""
        if GATED:
            g = gl.sum(acc, axis=0).to(gl.bfloat16).to(gl.float32)
            u = gl.sum(acc2, axis=0).to(gl.bfloat16).to(gl.float32)
            gl.store(o_ptr, _silu_mul(g, u), mask=o_mask)
        else:
            total = gl.sum(acc, axis=0)
            if SCALED:
                sc = gl.load(scale_ptr + o_dst, mask=col_live, other=0.0)
                gl.store(o_ptr, sc[None, :] * total.to(gl.bfloat16).to(gl.float32), mask=o_mask)
            else:
                gl.store(o_ptr, total.to(o_ptr.dtype.element_ty), mask=o_mask)

    @gluon.jit
    def _accumulate_staged(acc, acc2, w_base, sb_base, w2_base, sb2_base, x_sm, xs_sm, w_off, sb_off, w_live, zero_w,
                           W: gl.constexpr, RB: gl.constexpr, N8: gl.constexpr, NCH: gl.constexpr,
                           mma: gl.constexpr, dot_a: gl.constexpr, dot_b: gl.constexpr, XL: gl.constexpr,
                           CL: gl.constexpr, TWO: gl.constexpr, SELF_XS: gl.constexpr):
        """acc (+ acc2 from the second weight when TWO) + every chunk in order, x and xs read from _stage_x's
        buffers, each weight's next chunk requested before the current one is computed: _accumulate's arithmetic."""
        words, sb = _load_weight_chunk(w_base, sb_base, 0, w_off, sb_off, w_live, W)
        if TWO:
            words2, sb2 = _load_weight_chunk(w2_base, sb2_base, 0, w_off, sb_off, w_live, W)
        for c in gl.static_range(NCH):
            nc = min(c + 1, NCH - 1)
            nxt = _load_weight_chunk(w_base, sb_base, nc, w_off, sb_off, w_live, W)
            if TWO:
                nxt2 = _load_weight_chunk(w2_base, sb2_base, nc, w_off, sb_off, w_live, W)
            xv, xs = _staged_chunk(x_sm, xs_sm, c, XL, CL, SELF_XS)
            acc = _chunk_acc(acc, words, xv, sb, xs, zero_w, W, RB, N8, mma, dot_a, dot_b, SELF_XS)
            if TWO:
                acc2 = _chunk_acc(acc2, words2, xv, sb2, xs, zero_w, W, RB, N8, mma, dot_a, dot_b, SELF_XS)
                words2, sb2 = nxt2
            words, sb = nxt
        return acc, acc2

    @gluon.jit
    def _accumulate_wstaged(acc, acc2, w_base, sb_base, w2_base, sb2_base, x_ptr, xs_ptr, w_off, sb_off, x_off,
                            x_mask, xs_off, xs_mask, w_live, zero_w, W: gl.constexpr, RB: gl.constexpr,
                            N8: gl.constexpr, NCH: gl.constexpr, NS: gl.constexpr, mma: gl.constexpr,
                            dot_a: gl.constexpr, dot_b: gl.constexpr, WL: gl.constexpr, XL: gl.constexpr,
                            CL: gl.constexpr, TWO: gl.constexpr, SELF_XS: gl.constexpr):
        """acc (+ acc2 from the second weight when TWO) + every chunk in order, _accumulate's arithmetic, with the
        weight words through NS shared-memory slots: x (and xs) staged whole first (_stage_x, cp.async group 0),
        then chunk c's words by cp.async into slot c % NS (one group a chunk, NS - 1 chunks in flight), its scales
        into registers beside them; before chunk c is computed, the wait for its group and the words read back.
        Each thread reads back only the words it copied (the same layout both ways), so no barrier is needed; the
        slot refilled at chunk c held chunk c - 1, whose words the thread consumed in the iteration before."""
        x_sm, xs_sm = _stage_x(x_ptr, xs_ptr, x_off, x_mask, xs_off, xs_mask, W, N8, NCH, SELF_XS)
        SH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[4, 3, 2, 1, 0])
        w_sm = gl.allocate_shared_memory(gl.int32, [NS, W, RB, 8, 4, 4], SH)
        w2_sm = w_sm
        if TWO:
            w2_sm = gl.allocate_shared_memory(gl.int32, [NS, W, RB, 8, 4, 4], SH)
        wmask = (w_off >= 0) & w_live  # the tile's liveness over every word (an empty tile reads nothing)
        sbt = ()
        sbt2 = ()
        for c in gl.static_range(NCH + NS - 1):
            if c < NCH:  # request chunk c: its words into slot c % NS, its scales into registers
                async_copy.async_copy_global_to_shared(w_sm.index(c % NS), w_base + c * W * 128 + w_off, mask=wmask)
                sbt = sbt + (gl.load(sb_base + c * W * 32 + sb_off, mask=w_live, other=0.0),)
                if TWO:
                    async_copy.async_copy_global_to_shared(w2_sm.index(c % NS), w2_base + c * W * 128 + w_off,
                                                           mask=wmask)
                    sbt2 = sbt2 + (gl.load(sb2_base + c * W * 32 + sb_off, mask=w_live, other=0.0),)
                async_copy.commit_group()
            if c >= NS - 1:  # compute chunk c - (NS - 1): at most the groups after its own may still be pending
                async_copy.wait_group(min(NS - 1, NCH - 1 - (c - (NS - 1))))
                xv, xs = _staged_chunk(x_sm, xs_sm, c - (NS - 1), XL, CL, SELF_XS)
                acc = _chunk_acc(acc, w_sm.index((c - (NS - 1)) % NS).load(WL), xv, sbt[c - (NS - 1)], xs, zero_w,
                                 W, RB, N8, mma, dot_a, dot_b, SELF_XS)
                if TWO:
                    acc2 = _chunk_acc(acc2, w2_sm.index((c - (NS - 1)) % NS).load(WL), xv, sbt2[c - (NS - 1)], xs,
                                      zero_w, W, RB, N8, mma, dot_a, dot_b, SELF_XS)
        return acc, acc2

SPLIT_ROWS = 32  # rows of x a program of a split launch (split_rows)
SPLIT_MAXNREG = 128  # the split launches' register cap (split_maxnreg)


def split_rows(k: int, m: int) -> int:
    """Rows of x per program when mma_gemv splits a launch's m rows over programs (a second grid axis; never a
    row's bits), or 0: the weights of K >= 4096 (8 warps a program, 255 registers, one program an SM at 64 rows:
    the out projections) past SPLIT_ROWS rows. H200 (lab/NOTES.md): the out projection at 64 rows 17.8 us
    unsplit, 16.4 split in 32s with 128 registers (two programs an SM; SPLIT_MAXNREG), 19.2 uncapped, 18.8 in 16s;
    with the 8-row wgmma cap, 64 streams 5,097 -> 5,170 tok/s."""
    return SPLIT_ROWS if k >= 4096 and m > SPLIT_ROWS else 0


def split_maxnreg() -> dict:
    """The split launches' register cap as a launch option (never a bit): SPLIT_MAXNREG = 128, two 8-warp programs
    an SM at 32 rows (142 registers uncapped, 56 bytes of stack capped)."""
    return {"maxnreg": SPLIT_MAXNREG}


def decode_conv_args(conv: tuple | None, m: int, n: int, dtype: torch.dtype, placeholder: torch.Tensor):
    """(KCONV, the ten conv arguments) of a GEMV launch with the DeltaNet decode conv in its epilogue (conv: a
    DecodeConv or the same tuple, checked against m rows, n features and the activation dtype), or placeholders
    (never read) without one. The arguments: weight, pool, state slots, context lengths, channels, the weight's
    and the pool's strides."""
    if conv is None:
        return 4, (placeholder, placeholder, placeholder, placeholder, 0, 0, 0, 0, 0, 0)
    from ..gated_delta.triton_decode import DecodeConv, check_decode_conv

    cv = DecodeConv(*conv)
    kconv = check_decode_conv(cv, m, n, dtype)
    return kconv, (cv.weight, cv.pool, cv.state_slots, cv.context_lens, cv.channels, *cv.weight.stride(),
                   *cv.pool.stride())


def row_launches(gemv, x2: torch.Tensor, n: int, out: torch.Tensor | None, xs: torch.Tensor | None,
                 conv: tuple | None, name: str) -> torch.Tensor:
    """x2 [m, K] (m > MAX_ROWS) through gemv(rows, out, xs) in launches of MAX_ROWS rows: rows are MMA columns,
    independent of each other, so the same bits as one launch; [m, n] (into out when given). A conv only within
    one launch (its rows are sequences sliced alike: the caller's)."""
    m = x2.shape[0]
    if conv is not None:
        raise ValueError(f"{name}: {m} rows with conv=; at most {MAX_ROWS} per launch")
    out = torch.empty(m, n, dtype=x2.dtype, device=x2.device) if out is None else out
    for r in range(0, m, MAX_ROWS):
        gemv(x2[r: r + MAX_ROWS], out[r: r + MAX_ROWS], None if xs is None else xs[r: r + MAX_ROWS])
    return out


def column_tiles(m: int) -> int:
    """MMA column tiles (8 rows of x each) for m rows: a power of two, so few kernels are compiled."""
    nt = 1
    while 8 * nt < m:
        nt *= 2
    return nt


def mma_gemv(x: torch.Tensor, words: torch.Tensor, sb: torch.Tensor, out: torch.Tensor | None = None,
             xs: torch.Tensor | None = None, config: tuple[int, int, int] | None = None,
             conv: tuple | None = None) -> torch.Tensor:
    """y = x W^T for x [..., K] bf16 and a repack_q4 weight; [..., N] bf16 (launches of at most MAX_ROWS rows).
    out: bf16, or fp32 (not with conv=): the bf16 results widened (the logits' .float() without its launch).
    xs: the rows' group sums (fp32 [M, K / 64], triton_gemv.prep_x's or the norm's prep); None: the kernel makes
    its own on the tensor cores (MMA with ones: no prep launch; a fixed rounding of its own, per row).
    config: (W, RB, AHEAD) instead of default_config (W changes bits; RB and AHEAD do not).
    conv: gated_delta.triton_decode.DecodeConv (or the same as a tuple): x holds one token per sequence, and
    features < channels come out as SiLU(causal conv) with the pool updated, meant to equal this GEMV followed by
    triton_decode.causal_conv bit for bit (tests/gpu/test_mma_gemv_gpu.py).
    This kernel at every row count; the decode linears' entry, which runs larger launches on warpgroup MMAs with
    the same bits, is tensor_core_gemv.tc_gemv."""
    if not HAVE_GLUON or backend.interpreting() or x.device.type != "cuda":
        raise RuntimeError("mma_gemv: needs a CUDA device and Triton's Gluon (it has no interpreter form); "
                           "mma_gemv_reference is its CPU meaning")
    nb, g, _ = words.shape
    n, k = nb * ROW_BLOCK, g * GROUP
    if x.shape[-1] != k:
        raise ValueError(f"mma_gemv: input has {x.shape[-1]} features, the weight expects {k}")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"mma_gemv: activations must be bf16, found {x.dtype}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m > MAX_ROWS:
        return row_launches(lambda rows, out, xs: mma_gemv(rows, words, sb, out=out, xs=xs, config=config), x2, n,
                            out, xs, conv, "mma_gemv").reshape(*lead, n)
    if out is not None and (out.dtype not in (torch.bfloat16, torch.float32) or tuple(out.shape) != (m, n)
                            or out.stride(-1) != 1 or (conv is not None and out.dtype != torch.bfloat16)):
        raise ValueError(f"mma_gemv: out must be bf16 (or fp32 without conv=) [{m}, {n}] with unit column stride, "
                         f"found {out.dtype} {tuple(out.shape)} strides {out.stride()}")
    self_xs = xs is None
    if self_xs:
        xs = x2  # a placeholder pointer: not read
    elif xs.dtype != torch.float32 or tuple(xs.shape) != (m, g) or xs.stride(-1) != 1:
        raise ValueError(f"mma_gemv: xs must be fp32 [{m}, {g}] with unit column stride, found {xs.dtype} "
                         f"{tuple(xs.shape)} strides {xs.stride()}")
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    warps, rb, ahead = config or default_config(k, m, nb)
    if g % warps or nb % rb:
        raise ValueError(f"mma_gemv: config W={warps}, RB={rb} does not divide the {g} groups / {nb} row blocks")
    if ahead < 0:
        raise ValueError(f"mma_gemv: AHEAD={ahead}: 0 .. {g // warps - 1} chunks ahead (3 and up: the register "
                         f"ring), or >= the {g // warps} chunks (all, x staged)")
    staged = k * 8 * column_tiles(m) * x.element_size()
    if ahead >= g // warps and staged > STAGE_BYTES:
        raise ValueError(f"mma_gemv: AHEAD >= chunks stages x in shared memory, {staged} bytes for {m} rows of "
                         f"K={k}; at most {STAGE_BYTES}")
    kconv, conv_args = decode_conv_args(conv, m, n, x.dtype, x2)
    split = split_rows(k, m) if conv is None and config is None else 0
    splits = -(-m // split) if split else 1
    _mma_gemv_kernel[(nb // rb, splits)](x2, xs, words, sb, out, m, x2.stride(0), xs.stride(0), out.stride(0),
                                         *conv_args, K=k, W=warps, RB=rb, NT=column_tiles(split or m), AHEAD=ahead,
                                         CONV=conv is not None, KCONV=kconv, SELF_XS=self_xs, num_warps=warps,
                                         **({"SPLIT": True, **split_maxnreg()} if splits > 1 else {}),
                                         **pdl_args(x2))
    return out.reshape(*lead, n)


def repack_q4_experts(w: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor):
    """Stacked experts (w uint32 [E, N, K/8], scales/biases [E, N, K/64]) -> (words [E, N/16, K/64, 128],
    sb [E, N/16, K/64, 8, 2, 2]): repack_q4 per expert (N % 16 == 0, so no row block spans two experts)."""
    if w.dim() != 3:
        raise ValueError(f"repack_q4_experts: expected stacked words [E, N, K/8], found {tuple(w.shape)}")
    e, n, kw = w.shape
    words, sb = repack_q4(w.reshape(e * n, kw), scales.reshape(e * n, -1), biases.reshape(e * n, -1))
    return words.view(e, n // ROW_BLOCK, *words.shape[1:]), sb.view(e, n // ROW_BLOCK, *sb.shape[1:])


def mma_experts_reference(x: torch.Tensor, words: torch.Tensor, sb: torch.Tensor, expert_ids: torch.Tensor,
                          x_repeat: int = 1) -> torch.Tensor:
    """fp64 row m = x[m // x_repeat] W[expert_ids[m]]^T for repacked stacked experts (tests)."""
    ids = expert_ids.reshape(-1).long()
    out = torch.empty(ids.numel(), words.shape[1] * ROW_BLOCK, dtype=torch.float64, device=x.device)
    for e in ids.unique().tolist():
        rows = (ids == e).nonzero().flatten()
        out[rows] = mma_gemv_reference(x[rows // x_repeat], words[e], sb[e])
    return out


class MmaTiles(NamedTuple):
    """Which rows each program of the experts kernel takes (never a row's bits: each row is its own MMA column).
    rows == 1: tile t is row t alone and tile_e the rows' expert ids themselves (no table to build; each pick reads
    its expert's weights, as the CUDA-core decode does). rows in 8, 16, 32, 64: triton_affine.expert_tiles' table
    (tile_e, lo, hi, order) of tiles of at most `rows` sorted rows of one expert, so an expert picked by several
    rows is read once per tile."""

    tile_e: torch.Tensor
    lo: torch.Tensor | None
    hi: torch.Tensor | None
    order: torch.Tensor | None
    rows: int


def default_tile_rows(m: int, num_experts: int) -> int:
    """Rows per tile for m rows over num_experts: single rows while the mean rows per expert stays under one half
    (the table's three launches would cost more than the re-read weights they save), else tiles of 8 rows (one MMA
    column tile: on the H200 wider tiles were slower at every token count, up to 2.3x at 16 rows per expert; the
    experts kernel's gated form at 64 tokens, 8 rows 112 us, 16 rows 146, 32 rows ~600; at 512 tokens, 16 rows a
    tile per expert on average, 8 rows 260 us, 16 rows 308, 32 rows 491, pp512 15,699 / 14,881 / 11,466 tok/s,
    lab/NOTES.md: the kernel is bound by its programs' latency, not the dequant a wider tile shares). Never a
    row's bits."""
    if 2 * m <= num_experts:
        return 1
    return 8


def mma_expert_tiles(expert_ids: torch.Tensor, num_experts: int, rows: int | None = None) -> MmaTiles:
    """The tiles for rows with these expert ids (int32 in [0, num_experts), the routing contract), to share across
    an MoE block's calls. rows: rows per tile (default_tile_rows when None)."""
    ids = expert_ids.reshape(-1)
    m = ids.numel()
    rows = default_tile_rows(m, num_experts) if rows is None else rows
    if rows == 1:
        return MmaTiles(ids if ids.dtype == torch.int32 else ids.to(torch.int32), None, None, None, 1)
    if rows not in (8, 16, 32, 64):
        raise ValueError(f"mma_expert_tiles: rows per tile must be 1, 8, 16, 32 or 64 (MMA column tiles), found {rows}")
    from .triton_affine import expert_tiles

    return MmaTiles(*expert_tiles(ids, num_experts, rows), rows)


def default_row_blocks(nbe: int, m: int, k: int) -> int:
    """Row blocks of 16 per experts-kernel program (they share the program's x loads; never a row's bits): two for
    the short-K down projection past 16 rows, else one (H200: at K = 2048 more blocks were slower at every token
    count, at K = 512 two gave 50.9 vs 56.7 us at 64 tokens and 118 vs 141 at 512, one 3.6 vs 3.9 at 1)."""
    return 2 if k < 1024 and m > 16 and nbe % 2 == 0 else 1


def default_ahead(m: int, gated: bool, chunks: int = 8) -> int:
    """Chunks in flight per warp in the experts kernel (never a row's bits) for m rows and `chunks` chunks per warp.
    Up to 16 rows (one token's picks): the register ring, 4 for the gated gate/up and chunks - 1 (the whole slice
    up front) for down (H200, 35B-A3B q4, lab/NOTES.md: sweep at T=1 gated 8.36 -> 6.89 us, down 4.49 -> 4.36;
    in the model, tensor-core MoE at B=1: AHEAD 2,1 569.7 -> 4,7 595.7 tok/s with the sums-only norm, 4,4 589.0,
    3,7 584.7, 5,7 588.7, 7,7 579.7). Past 16 rows: two for the gated form and down (64 tokens: gated 118.5 ->
    101.0 us, down 50.5 -> 47.1; the ring at 4 was no faster there)."""
    if m <= 16:
        return max(1, min(4 if gated else chunks - 1, chunks - 1)) if chunks > 1 else 1
    return 2


WSTAGE_BYTES = 160 << 10  # x staged whole plus the weight words' slots (the WSTAGE form): at most this per program
WSTAGE_DOWN = 3  # down's default slots from WSTAGE_MIN_ROWS rows (default_wstage)
WSTAGE_MIN_ROWS = 1024  # above a 64-stream decode's 576 rows: prefill only


def default_wstage(m: int, gated: bool) -> int:
    """The weight words' shared-memory slots of the experts kernel (0: the words in registers, the AHEAD forms;
    never a row's bits). ncu at a 512-token prefill found down's stalls 61% on its weight words, and more chunks in
    registers were slower (AHEAD 2 -> 3 .. 8: 111.9 -> 118.5 .. 141.2 us). H200, 35B-A3B q4 (lab/NOTES.md, the
    sweep at 64 / 512 / 4096 tokens, 576+ rows): down with 3 slots 56.9 -> 51.8 / 133.0 -> 125.1 / 853.8 -> 853.2
    us (2: 53.4 / 125.1 / 852.9; 5 and 9 slower), the gated form slower with any (260 -> 335-373 us at 512), pp512
    B=1 18,346 -> 18,499, B=8 24,556 -> 24,772, then 17,831 -> 18,391; but 64-stream decode (576 rows) 2,451 ->
    2,303 tok/s: down takes WSTAGE_DOWN slots from WSTAGE_MIN_ROWS rows (prefill sizes), the gated form none."""
    if m <= 16 or gated or m < WSTAGE_MIN_ROWS:
        return 0
    return WSTAGE_DOWN


def pair_counters_fit(tiles: MmaTiles, nbe: int) -> bool:
    """Whether a pair_out launch over stacked [gate; up] weights of nbe row blocks per expert has a (tile, row-block
    pair) counter for each of `tiles`' tiles within the PAIR_COUNTERS allocated."""
    return tiles.tile_e.numel() * (nbe // 2) <= PAIR_COUNTERS


def experts_operands(x: torch.Tensor, words: torch.Tensor, sb: torch.Tensor, up: tuple | None,
                     scale: torch.Tensor | None, xs: torch.Tensor | None, m: int, out: torch.Tensor | None,
                     who: str) -> torch.Tensor:
    """The checks both experts matmuls (mma_matmul_experts, wgmma_experts.wg_matmul_experts) make of their operands,
    for m rows against the stacked repacked weight (words, sb) [E, N / 16, G, ...]: the up weight of the gate's
    shape, one fp32 scale per row, x's group sums xs fp32 [rows of x, G] (None: the kernel's own); returns the output
    [m, N] (fp32 when scaled, else x's dtype), checked or allocated."""
    g, n = words.shape[2], words.shape[1] * ROW_BLOCK
    if up is not None and (up[0].shape != words.shape or up[1].shape != sb.shape):
        raise ValueError(f"{who}: the up weight {tuple(up[0].shape)} must have the gate's shape {tuple(words.shape)}")
    if scale is not None and (scale.dtype != torch.float32 or scale.numel() != m or not scale.is_contiguous()):
        raise ValueError(f"{who}: scale must be contiguous fp32 with one value per row ({m}), found {scale.dtype} "
                         f"{tuple(scale.shape)}")
    if xs is not None and (xs.dtype != torch.float32 or tuple(xs.shape) != (x.shape[0], g) or xs.stride(-1) != 1):
        raise ValueError(f"{who}: xs must be fp32 [{x.shape[0]}, {g}] with unit column stride, found {xs.dtype} "
                         f"{tuple(xs.shape)} strides {xs.stride()}")
    out_dtype = torch.float32 if scale is not None else x.dtype
    if out is None:
        return torch.empty(m, n, dtype=out_dtype, device=x.device)
    if out.dtype != out_dtype or out.shape != (m, n) or out.stride(-1) != 1:
        raise ValueError(f"{who}: out must be {out_dtype} [{m}, {n}] with unit column stride, found {out.dtype} "
                         f"{tuple(out.shape)} strides {out.stride()}")
    return out


def mma_matmul_experts(x: torch.Tensor, words: torch.Tensor, sb: torch.Tensor, expert_ids: torch.Tensor,
                       x_repeat: int = 1, xs: torch.Tensor | None = None, out: torch.Tensor | None = None,
                       tiles: MmaTiles | None = None, up: tuple | None = None, scale: torch.Tensor | None = None,
                       config: tuple[int, int] | None = None, combine: tuple | None = None,
                       glu: bool = False, pair_out: torch.Tensor | None = None, open_late: bool = False,
                       early: bool = False) -> torch.Tensor:
    """Row m of the result = x[m // x_repeat] W[expert_ids[m]]^T on tensor cores, for stacked repacked experts
    (repack_q4_experts) and x [rows, K] bf16; [M, N] in x's dtype. The same rows as
    triton_affine.affine_matmul_experts (an MoE block's gate, up and down), each row an MMA column of its expert's
    tile: a row's bits depend on (K, W) only. xs: x's group sums (prep_x's, [rows, K / 64]); None: the kernel's own
    (MMA with ones, as mma_gemv's: no prep launch).
    tiles: mma_expert_tiles(ids, E) to share across the block's calls (None: built here).
    up: a second stacked weight (words, sb) of W's shape: the result is h = SiLU(x W^T) * (x W_up^T) in bf16
    (the kernel's GATED epilogue). scale: fp32 [M]: the result is fp32, scale[m] * bf16(row m) (SCALED).
    config: (W, RB[, AHEAD[, LOOP[, WSTAGE]]]) warps per program (changes bits), row blocks per program held
    together, chunks in flight (1 .. chunks - 1 in registers, chunks - 1 being the whole slice up front; or >= the
    chunks: the whole weight slice at once, x by cp.async), rounds of RB row blocks per program over x staged once
    in shared memory (LOOP > 1) and the weight words' shared-memory slots (WSTAGE >= 2: cp.async, WSTAGE - 1 chunks
    in flight, x staged whole; 0: registers; default_wstage); none but W changes bits.
    combine: (residual [T, N] or None, comb [T, N]) with scale= and single-row tiles, rows being T tokens x S
    slots: the launch also does triton_combine.combine_slots(out.view(T, S, N), residual, comb) (the same
    arithmetic, the same bits) at each token's last-arriving program, and returns comb; out still holds the parts.
    glu: x is [rows, 2K] of (g, u) pairs (a plain launch over stacked [gate; up] weights) and the rows multiplied
    are h = bf16(bf16(SiLU(g)) * u), the gated launch's output bit for bit (no up=, LOOP 1, AHEAD < the chunks).
    pair_out: bf16 [M, N / 2] for a plain launch over stacked [gate; up] weights (N = 2 I rows per expert): out
    gets g | u and pair_out h = bf16(bf16(SiLU(g)) * u), made by the second program of each (gate, up) row-block
    pair (the gated launch's bits); RB 1, LOOP 1, and at most PAIR_COUNTERS tiles x I / 16 pairs.
    open_late: the next launch in the stream may start only once every program of this one has passed its PDL
    wait (the routing it waited for is then complete). early: with PDL, this launch reads the expert ids and its
    first chunks' weights before its wait; only right after a launch made with open_late that waited for the ids'
    writer, with single-row tiles, one weight and the register ring (3 <= AHEAD < the chunks). Neither changes
    bits."""
    if not HAVE_GLUON or backend.interpreting() or x.device.type != "cuda":
        raise RuntimeError("mma_matmul_experts: needs a CUDA device and Triton's Gluon; mma_experts_reference is "
                           "its CPU meaning")
    num_e, nbe, g, _ = words.shape
    n, k = nbe * ROW_BLOCK, g * GROUP
    width = 2 * k if glu else k
    if x.dim() != 2 or x.shape[1] != width or x.stride(-1) != 1 or x.dtype != torch.bfloat16:
        raise ValueError(f"mma_matmul_experts: x must be row-major bf16 [rows, {width}]"
                         f"{' (g | u pairs: glu)' if glu else ''}, found {x.dtype} {tuple(x.shape)}")
    if glu and up is not None:
        raise ValueError("mma_matmul_experts: glu (h made from g | u at load) and up= (the gated launch) exclude "
                         "each other")
    ids = expert_ids.reshape(-1)
    m = ids.numel()
    if m != x.shape[0] * x_repeat:
        raise ValueError(f"mma_matmul_experts: {m} expert ids for {x.shape[0]} rows x {x_repeat} repeats")
    if up is not None and scale is not None:
        raise ValueError("mma_matmul_experts: up= (the gated epilogue) and scale= are exclusive")
    self_xs = xs is None
    out = experts_operands(x, words, sb, up, scale, xs, m, out, "mma_matmul_experts")
    xs = x if self_xs else xs  # a placeholder pointer when the kernel makes the group sums: not read
    tiles = mma_expert_tiles(ids, num_e) if tiles is None else tiles
    if not isinstance(tiles, MmaTiles):
        raise TypeError("mma_matmul_experts: tiles must come from mma_expert_tiles")
    want = m if tiles.rows == 1 else -(-m // tiles.rows) + min(num_e, m)
    if tiles.tile_e.numel() != want:  # a table built for other rows would drop or misread rows
        raise ValueError(f"mma_matmul_experts: tiles of {tiles.rows} rows for {m} rows must number {want}, found "
                         f"{tiles.tile_e.numel()} (build them with mma_expert_tiles for these ids)")
    warps = config[0] if config else default_warps(k)
    defaults = (warps, default_row_blocks(nbe, m, k), default_ahead(m, up is not None, g // warps), 1,
                default_wstage(m, up is not None))
    warps, rb, ahead, loop, wstage = (*config, *defaults[len(config):]) if config else defaults
    ring_form = loop == 1 and not (glu or early) and pair_out is None  # the forms the WSTAGE ring serves
    if len(config or ()) < 5 and not (ring_form and combine is None):
        wstage = 0  # the default slots: the plain, gated and scaled forms only
    if loop < 1 or nbe % (rb * loop):
        raise ValueError(f"mma_matmul_experts: LOOP={loop} rounds of RB={rb} row blocks must divide the {nbe} row "
                         f"blocks")
    staged = k * 8 * column_tiles(tiles.rows) * x.element_size()
    if wstage:
        ring = wstage * warps * rb * 512 * (2 if up is not None else 1)
        if wstage < 2 or not ring_form or staged + ring > WSTAGE_BYTES:
            raise ValueError(f"mma_matmul_experts: WSTAGE={wstage} (the weight words' shared-memory slots) needs 2+ "
                             f"slots, LOOP 1, no glu / pair_out / early, and x staged ({staged} bytes) plus the "
                             f"slots ({ring}) within {WSTAGE_BYTES} bytes")
    if (loop > 1 or ahead >= g // warps or wstage) and staged > STAGE_BYTES:
        raise ValueError(f"mma_matmul_experts: LOOP > 1 and AHEAD >= chunks stage x in shared memory, {staged} bytes "
                         f"for K={k} and tiles of {tiles.rows} rows; at most {STAGE_BYTES}")
    if ahead < 1:
        raise ValueError(f"mma_matmul_experts: AHEAD (chunks in flight) must be 1 .. {g // warps - 1} (in registers) or "
                         f">= the {g // warps} chunks (all, x staged), found {ahead}")
    pairs = 0
    if pair_out is not None:
        pairs = nbe // 2
        if up is not None or scale is not None or combine is not None or nbe % 2 or rb != 1 or loop != 1:
            raise ValueError("mma_matmul_experts: pair_out needs a plain launch (no up= / scale= / combine=) over an "
                             f"even number of row blocks ({nbe}) with RB 1 and LOOP 1, found RB={rb} LOOP={loop}")
        if pair_out.dtype != torch.bfloat16 or pair_out.shape != (m, n // 2) or pair_out.stride(-1) != 1:
            raise ValueError(f"mma_matmul_experts: pair_out must be bf16 [{m}, {n // 2}] with unit column stride, "
                             f"found {pair_out.dtype} {tuple(pair_out.shape)}")
    if glu and (loop > 1 or ahead >= g // warps):
        raise ValueError(f"mma_matmul_experts: glu loads x in registers: LOOP 1 and AHEAD below the {g // warps} "
                         f"chunks, found LOOP={loop} AHEAD={ahead}")
    if early and (tiles.rows != 1 or up is not None or pair_out is not None or loop != 1
                  or not 3 <= ahead < g // warps):
        raise ValueError(f"mma_matmul_experts: early needs single-row tiles, one weight and the register ring "
                         f"(3 <= AHEAD < {g // warps}), found rows={tiles.rows} AHEAD={ahead} LOOP={loop}"
                         f"{' up=' if up is not None else ''}")
    if g % warps or nbe % rb:
        raise ValueError(f"mma_matmul_experts: config W={warps}, RB={rb} does not divide the {g} groups / {nbe} "
                         f"row blocks")
    slots, res, comb, counters = 1, out, out, out
    if pair_out is not None:
        from ..triton_sync import arrival_counters

        if not pair_counters_fit(tiles, nbe):
            raise ValueError(f"mma_matmul_experts: pair_out for {tiles.tile_e.numel() * pairs} (tile, pair) "
                             f"counters, at most {PAIR_COUNTERS}")
        comb, counters = pair_out, arrival_counters(x.device, PAIR_COUNTERS)  # one size: allocated before capture
    if combine is not None:
        res, comb = combine
        if scale is None or tiles.rows != 1:
            raise ValueError("mma_matmul_experts: combine= needs scale= (the down projection) and single-row tiles")
        tokens = comb.shape[0] if comb.dim() == 2 else -1
        if tokens <= 0 or m % tokens or comb.shape != (tokens, n) or comb.stride(-1) != 1 or \
                comb.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"mma_matmul_experts: combine's output must be bf16/fp16 [T, {n}] with T dividing the "
                             f"{m} rows, found {comb.dtype} {tuple(comb.shape)}")
        if res is not None and (res.shape != comb.shape or res.stride(-1) != 1):
            raise ValueError(f"mma_matmul_experts: combine's residual must be [{tokens}, {n}] with unit column "
                             f"stride, found {tuple(res.shape)}")
        slots = m // tokens
        from ..triton_sync import arrival_counters

        counters = arrival_counters(x.device, tokens * (nbe // (rb * loop)))
    if m:
        single = tiles.rows == 1
        table = (tiles.tile_e,) * 3 if single else (tiles.lo, tiles.hi, tiles.order)
        w2, sb2 = up if up is not None else (words, sb)
        rs = comb if combine is None or res is None else res
        _mma_experts_kernel[(tiles.tile_e.numel(), nbe // (rb * loop))](
            x, xs, words, sb, w2, sb2, out, scale if scale is not None else out, tiles.tile_e, *table, x.stride(0),
            xs.stride(0), out.stride(0), nbe, rs, comb, counters, rs.stride(0), comb.stride(0), XREP=x_repeat, K=k,
            W=warps, NT=column_tiles(tiles.rows), RB=rb, SINGLE=single, GATED=up is not None,
            SCALED=scale is not None, SELF_XS=self_xs, COMBINE=combine is not None, SLOTS=slots,
            HAS_RES=combine is not None and res is not None, AHEAD=ahead, LOOP=loop, GLU=k if glu else 0,
            PAIR=pairs, num_warps=warps,
            **pdl_args(x), **({"OPEN_LATE": True} if open_late else {}), **({"EARLY": True} if early else {}),
            **({"WSTAGE": wstage} if wstage else {}), **({} if skip_empty_tiles() else {"SKIP_EMPTY": False}))
    return out if combine is None else comb


def skip_empty_tiles() -> bool:
    """Whether the experts kernel's programs on the tile table's unused tail tiles return at once instead of
    running the K loop on masked loads (never a row's bits; single-row, pair and combine launches always run it):
    yes, pp512 +4.6% on the H200 (lab/NOTES.md)."""
    return True

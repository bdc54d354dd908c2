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

The MoE's experts matmul on this layout and these Gluon helpers is moe/mma_experts.py (it imports them from here).
"""

from __future__ import annotations

import torch

from .. import backend
from ..launch_table import value as launch_value
from ..triton_pdl import pdl_args

GROUP = 64
ROW_BLOCK = 16  # output rows per program (the MMA's M)
MAX_ROWS = 64  # rows of x per launch (8 MMA column tiles)
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


def ring_max_blocks() -> int:
    """Row blocks of 16 from which a weight counts as the lm_head's many (launch_table "gemv_mma.ring_max_blocks"):
    below it mma_gemv runs the register ring up to 8 rows (default_config), from it wg_gemv takes its wider tiles
    (tensor_core_gemv.wg_gemv_tile_rows)."""
    return launch_value("gemv_mma.ring_max_blocks")


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
    launch_table "gemv_mma.ring_max_blocks" row blocks: after-norm sweep, one row, 12352 x 2048 9.45 -> 8.05 us,
    9216 x 2048 8.78 -> 6.93, 2048 x 4096 9.03 -> 7.16; 8 rows 10.82 -> 9.62, 10.60 -> 8.10, 8.92 -> 8.55; the
    lm_head's 15520 blocks keep AHEAD 1 (84.1 us; the ring 90.1 at one row, 106.0 at 8)."""
    warps = default_warps(k)
    two = nb is None or nb % 2 == 0
    if m <= 8:
        chunks = k // GROUP // warps
        ring = chunks - 1 >= 3 and (nb is None or nb < ring_max_blocks())
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

    # The register layouts both kernels share (this GEMV's and moe/mma_experts'; W warps splitting K, RB row blocks
    # of 16 per program); the layouts derived from them (dot operands, slices) are spelled where they are used.
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
        h = bf16(bf16(SiLU(g)) * u), the gated epilogue's arithmetic (moe/mma_experts._experts_store) on the same
        bf16 values."""
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


def split_rows(k: int, m: int) -> int:
    """Rows of x per program when mma_gemv splits a launch's m rows over programs (a second grid axis; never a
    row's bits), or 0: the weights of K >= 4096 (8 warps a program, 255 registers, one program an SM at 64 rows:
    the out projections) past launch_table "gemv_mma.split_rows" rows, in programs of that many (what it won
    against: the table's doc, lab/NOTES.md)."""
    split = launch_value("gemv_mma.split_rows")
    return split if k >= 4096 and m > split else 0


def split_maxnreg() -> dict:
    """The split launches' register cap as a launch option (never a bit): launch_table "gemv_mma.split_maxnreg"
    (128: two 8-warp programs an SM at 32 rows, 142 registers uncapped, 56 bytes of stack capped)."""
    return {"maxnreg": launch_value("gemv_mma.split_maxnreg")}


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

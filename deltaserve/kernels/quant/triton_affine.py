"""Affine group-wise (MLX layout) matmul on the GPU: y = x W^T with W packed, dequantised tile by tile in registers.

Same meaning as `kernels/quant/affine.py::affine_linear` (dequantise to the activation dtype, fp32 accumulation,
result in x's dtype). Layouts: see `kernels/triton_common.py`. Also serves dense bf16 weights (bits=16) so that
every projection can share one batch-invariant kernel.

Two kernels, each batch-invariant by construction (a row's result depends only on (N, K, bits, group), never on
how many rows share the launch; no split-K):

  _affine_mm_kernel       (stacked experts) 16-row sub-tiles of x times a dequantised [BK, BN] weight tile with
                          `tl.dot` of the SAME shape [16, BK] x [BK, BN] (mma.sync m16), the K steps chained in
                          order into one fp32 accumulator per sub-tile. Neither M, nor how many sub-tiles share a
                          program (SUB: each dequantised tile serves up to 16 * SUB rows), nor BN changes the
                          instruction sequence that produces a row.
  _affine_mm_wide_kernel  (one 2-D weight) one [BM, BK] x [BK, BN] `tl.dot` per K step (or, SWAP, the same
                          products as W x^T with the tokens as the MMA's n), the tile fixed by the weight's shape
                          alone (never by M), so every row of every call runs the same Hopper wgmma chain (rows and
                          columns of an MMA are independent of each other). On the H200 its bits also
                          equal the 16-row kernel's (lab/sweep_prefill_kernels.py, every prefill shape), which
                          the GPU tests check, but nothing here relies on that.

and, for the dense projections from launch_table "affine.dequant_min_rows" rows (`dense_path`), two launches instead
of the wide kernel:

  _dequant_kernel         the weight dequantised once to x's dtype (dequant_tile's values, each rounded once: what
                          the wide kernel's tile holds before its MMA);
  _dense_mm_tma_kernel    x times it, one [BM, BK] x [BK, BN] `tl.dot` per K step, the tiles fetched by TMA and
                          pipelined by Triton (no dequantisation inside the K loop); _dense_mm_kernel is the same
                          with pointer loads (cp.async), for operands TMA cannot describe and the interpreter.
                          The same products in the same K order as the wide kernel: on the H200 the same bits for
                          every tile tried (GPU test), at ~2-3x its speed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch_table import value as launch_value
from ..triton_common import DENSE_BITS, WeightSpec, dequant_tile, dot_f32, mma

ROWS_PER_SUBTILE = 16


@triton.jit
def _affine_mm_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr,
    tile_e_ptr, tile_lo_ptr, tile_hi_ptr, order_ptr,
    M, N, K, x_repeat,
    stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_om,
    BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SUB: tl.constexpr,
    EXPERTS: tl.constexpr, F32: tl.constexpr,
):
    # grid: (cdiv(N, BN), row tiles). A row tile holds 16*SUB output rows; with EXPERTS, row tile t covers sorted
    # rows [lo_t, hi_t) of one expert e_t (e_t < 0: unused tile), and order maps sorted -> output row.
    pid_n = tl.program_id(0)
    pid_t = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    n_mask = rn < N
    r16 = tl.arange(0, 16)
    if EXPERTS:
        e = tl.load(tile_e_ptr + pid_t)
        if e < 0:
            return
        lo = tl.load(tile_lo_ptr + pid_t)
        hi = tl.load(tile_hi_ptr + pid_t)
        w_ptr += e.to(tl.int64) * stride_we
        s_ptr += e.to(tl.int64) * stride_se
        b_ptr += e.to(tl.int64) * stride_se
        sl0 = lo + r16
        m0 = sl0 < hi
        row0 = tl.load(order_ptr + sl0, mask=m0, other=0)
        sl1 = lo + 16 + r16
        m1 = sl1 < hi
        row1 = tl.load(order_ptr + sl1, mask=m1, other=0)
        sl2 = lo + 32 + r16
        m2 = sl2 < hi
        row2 = tl.load(order_ptr + sl2, mask=m2, other=0)
        sl3 = lo + 48 + r16
        m3 = sl3 < hi
        row3 = tl.load(order_ptr + sl3, mask=m3, other=0)
    else:
        row0 = pid_t * (16 * SUB) + r16
        row1 = row0 + 16
        row2 = row0 + 32
        row3 = row0 + 48
        m0 = row0 < M
        m1 = row1 < M
        m2 = row2 < M
        m3 = row3 < M
    x0 = x_ptr + (row0 // x_repeat).to(tl.int64)[:, None] * stride_xm
    x1 = x_ptr + (row1 // x_repeat).to(tl.int64)[:, None] * stride_xm
    x2 = x_ptr + (row2 // x_repeat).to(tl.int64)[:, None] * stride_xm
    x3 = x_ptr + (row3 // x_repeat).to(tl.int64)[:, None] * stride_xm
    acc0 = tl.zeros((16, BN), dtype=tl.float32)
    acc1 = tl.zeros((16, BN), dtype=tl.float32)
    acc2 = tl.zeros((16, BN), dtype=tl.float32)
    acc3 = tl.zeros((16, BN), dtype=tl.float32)
    rk = tl.arange(0, BK)
    for k0 in range(0, K, BK):
        w = dequant_tile(w_ptr, s_ptr, b_ptr, rn, n_mask, k0, stride_wn, stride_sn, BN, BK, BITS, GROUP)
        wt = tl.trans(w.to(x_ptr.dtype.element_ty))  # [BK, BN], rounded once to the activation dtype
        xa = tl.load(x0 + (k0 + rk)[None, :], mask=m0[:, None], other=0.0)
        acc0 = mma(xa, wt, acc0, F32)
        if SUB > 1:
            xb = tl.load(x1 + (k0 + rk)[None, :], mask=m1[:, None], other=0.0)
            acc1 = mma(xb, wt, acc1, F32)
        if SUB > 2:
            xc = tl.load(x2 + (k0 + rk)[None, :], mask=m2[:, None], other=0.0)
            acc2 = mma(xc, wt, acc2, F32)
            xd = tl.load(x3 + (k0 + rk)[None, :], mask=m3[:, None], other=0.0)
            acc3 = mma(xd, wt, acc3, F32)
    o_ty = out_ptr.dtype.element_ty
    cols = rn[None, :]
    tl.store(out_ptr + row0.to(tl.int64)[:, None] * stride_om + cols, acc0.to(o_ty), mask=m0[:, None] & n_mask[None, :])
    if SUB > 1:
        tl.store(out_ptr + row1.to(tl.int64)[:, None] * stride_om + cols, acc1.to(o_ty),
                 mask=m1[:, None] & n_mask[None, :])
    if SUB > 2:
        tl.store(out_ptr + row2.to(tl.int64)[:, None] * stride_om + cols, acc2.to(o_ty),
                 mask=m2[:, None] & n_mask[None, :])
        tl.store(out_ptr + row3.to(tl.int64)[:, None] * stride_om + cols, acc3.to(o_ty),
                 mask=m3[:, None] & n_mask[None, :])


@triton.jit
def _affine_mm_wide_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_om,
    BITS: tl.constexpr, GROUP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    SWAP: tl.constexpr, F32: tl.constexpr,
):
    # grid: (cdiv(N, BN), cdiv(M, BM)). out[rows, rn] = x[rows] W[rn]^T, one dot of BM rows per K step.
    # SWAP: the same products as out^T = W x^T, the weight tile as the MMA's A operand (m64 per warpgroup over
    # weight rows, the BM tokens as its n); Triton then stages the dequantised tile with stmatrix instead of one
    # 16-bit shared-memory store per element (sm_90 SASS), faster for the big projections (wide_config)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    n_mask = rn < N
    row = pid_m * BM + tl.arange(0, BM)
    m_row = row < M
    xp = x_ptr + row.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acct = tl.zeros((BN, BM), dtype=tl.float32)
    rk = tl.arange(0, BK)
    for k0 in range(0, K, BK):
        w = dequant_tile(w_ptr, s_ptr, b_ptr, rn, n_mask, k0, stride_wn, stride_sn, BN, BK, BITS, GROUP)
        w = w.to(x_ptr.dtype.element_ty)  # [BN, BK], rounded once to the activation dtype
        xa = tl.load(xp + (k0 + rk)[None, :], mask=m_row[:, None], other=0.0)
        if SWAP:
            acct = mma(w, tl.trans(xa), acct, F32)
        else:
            acc = mma(xa, tl.trans(w), acc, F32)
    if SWAP:
        acc = tl.trans(acct)
    tl.store(out_ptr + row.to(tl.int64)[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_row[:, None] & n_mask[None, :])


def wide_config(spec: WeightSpec) -> tuple[int, int, int, int, int, bool]:
    """(BM, BN, BK, num_warps, num_stages, SWAP) of the wide kernel for a weight: a function of the weight alone (BM
    may not depend on M: see the module doc). H200, M = 512 (lab/sweep_prefill_kernels.py, lab/NOTES.md):
    swapped operands over 64 weight rows x 128 tokens for the big projections (12352x2048 146 -> 112 us, 9216x2048
    140 -> 99, 2048x4096 64 -> 53 against the unswapped 128 x 128 / 128 x 64 tiles, which were 238 / 182 / 87 as
    16-row tiles); the narrow ones stay unswapped (2048x512: 32 us, swapped 56)."""
    bk = spec.block_k(128)
    if spec.n >= 2048 and spec.k >= 2048:
        return 128, 64, bk, 4, 3, True
    if spec.n >= 2048:
        return 128, 64, bk, 8, 3, False
    return 64, 64, bk, 4, 3, False


def _launch_wide(x2, spec: WeightSpec, out, config=None):
    bm, bn, bk, warps, stages, swap = config or wide_config(spec)
    if spec.k % bk or (spec.bits != DENSE_BITS and bk % spec.group and spec.group % bk):
        raise ValueError(f"affine config: BK {bk} must divide K {spec.k} and nest with the group size {spec.group}")
    mma_m = bn if swap else bm  # the MMA's m: 64 rows per warpgroup of 4 warps
    if mma_m % 64 or warps != 4 * (mma_m // 64) or (swap and bm % 16):
        raise ValueError(f"affine wide config: the MMA's m ({'BN' if swap else 'BM'} {mma_m}) must be a multiple of "
                         f"64 with 4 warps per 64 (one warpgroup each), found {warps} warps"
                         + (f"; BM {bm} must be a multiple of 16" if swap else ""))
    m = x2.shape[0]
    grid = (triton.cdiv(spec.n, bn), triton.cdiv(m, bm))
    _affine_mm_wide_kernel[grid](
        x2, spec.w, spec.scales, spec.biases, out, m, spec.n, spec.k,
        x2.stride(0), spec.w.stride(-2), spec.scales.stride(-2), out.stride(0),
        BITS=spec.bits, GROUP=spec.group, BM=bm, BN=bn, BK=bk, SWAP=swap, F32=dot_f32(), num_warps=warps,
        num_stages=stages,
    )


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, b_ptr, out_ptr, N, K, stride_wn, stride_sn, stride_on,
                    BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # grid: (cdiv(N, BN), K / BK). out[rn, k0:k0+BK] = W rounded to out's dtype: dequant_tile's formula, so each
    # element is the value the wide kernel's tile holds before its MMA
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    n_mask = rn < N
    k0 = tl.program_id(1) * BK
    w = dequant_tile(w_ptr, s_ptr, b_ptr, rn, n_mask, k0, stride_wn, stride_sn, BN, BK, BITS, GROUP)
    rk = k0 + tl.arange(0, BK)
    tl.store(out_ptr + rn.to(tl.int64)[:, None] * stride_on + rk[None, :], w.to(out_ptr.dtype.element_ty),
             mask=n_mask[:, None])


@triton.jit
def _dense_mm_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, F32: tl.constexpr):
    # grid: (cdiv(M, BM) * cdiv(N, BN),), the M tiles of one N tile adjacent (they share its weight tile while it
    # is in the L2). out[rows, rn] = x[rows] W[rn]^T for a dense W [N, K] in x's dtype: one [BM, BK] x [BK, BN]
    # dot per K step, chained in order: whatever the tile, each output element is the same chain of k16 MMAs, so a
    # row's bits never depend on M or on the other rows (dense_config)
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    pid_m = pid % num_m
    pid_n = pid // num_m
    row = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    m_row = row < M
    n_mask = rn < N
    rk = tl.arange(0, BK)
    xp = x_ptr + row.to(tl.int64)[:, None] * stride_xm + rk[None, :]
    wp = w_ptr + rn.to(tl.int64)[:, None] * stride_wn + rk[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        xa = tl.load(xp + k0, mask=m_row[:, None], other=0.0)
        wb = tl.load(wp + k0, mask=n_mask[:, None], other=0.0)
        acc = mma(xa, tl.trans(wb), acc, F32)
    tl.store(out_ptr + row.to(tl.int64)[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_row[:, None] & n_mask[None, :])


@triton.jit
def _dense_mm_tma_kernel(x_desc, w_desc, out_ptr, M, N, K, stride_om, BM: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr):
    # _dense_mm_kernel with the x and W tiles fetched by TMA (host tensor descriptors; rows past M or N read as 0)
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    pid_m = pid % num_m
    pid_n = pid // num_m
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        xa = x_desc.load([pid_m * BM, k0])
        wb = w_desc.load([pid_n * BN, k0])
        acc = tl.dot(xa, wb.T, acc)
    row = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    tl.store(out_ptr + row.to(tl.int64)[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(row < M)[:, None] & (rn < N)[None, :])


def dequantize(spec: WeightSpec, out: torch.Tensor | None = None, dtype=torch.bfloat16,
               tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """W [N, K] in `dtype` (dequant_tile's values, each rounded once), for the dequantise-then-multiply prefill
    path; out: a preallocated [N, K] buffer; tile: (BN, BK, num_warps) instead of launch_table
    "affine.dequant_tile" (sweeps; BK is lowered to one that divides K and nests with the group)."""
    if spec.w.dim() != 2:
        raise ValueError(f"dequantize: weight must be 2-D [N, packed K], found shape {tuple(spec.w.shape)}")
    if out is None:
        out = torch.empty(spec.n, spec.k, dtype=dtype, device=spec.w.device)
    elif out.shape != (spec.n, spec.k) or out.stride(-1) != 1:
        raise ValueError(f"dequantize: out must be [{spec.n}, {spec.k}] with unit column stride, found "
                         f"{tuple(out.shape)} strides {out.stride()}")
    bn, bk, warps = tile or launch_value("affine.dequant_tile")
    bk = spec.block_k(bk)
    if spec.bits != DENSE_BITS and bk % spec.group and spec.group % bk:
        raise ValueError(f"dequantize: no K tile nests with the group size {spec.group} for K = {spec.k}")
    _dequant_kernel[(triton.cdiv(spec.n, bn), spec.k // bk)](
        spec.w, spec.scales, spec.biases, out, spec.n, spec.k, spec.w.stride(-2), spec.scales.stride(-2),
        out.stride(0), BITS=spec.bits, GROUP=spec.group, BN=bn, BK=bk, num_warps=warps)
    return out


def dense_path(m: int) -> str:
    """How a prefill multiplies m rows by a 2-D weight: "dequant" (the weight dequantised once to x's dtype by
    `dequantize`, then `dense_mm`), "fused" (the model's q4 g64 projections with a natural-order repack,
    model/fast.prefill_dense_weights: wgmma_dense.wg_dense_mm, which dequantises in registers; affine_matmul, which
    has no repack, takes "dequant" for it) or "wide" (the wide kernel, dequantising each weight tile for every 128
    rows). All three give the same bits: each chains the same bf16 products (dequant_tile's weight values) k16 step
    by k16 step in K order on the tensor cores (GPU tests, every prefill shape and several M).
    H200, the 35B-A3B's projections (a probe, lab/NOTES.md): at 512 rows 12352 x 2048
    wide 106.4 us, dequantise 21.7 + multiply 49 (66.6 together), fused 51.5; 9216 x 2048 97.3, 55.6, 43.2;
    2048 x 4096 52.1, 25.9, 33.1 (128 programs: model/fast.prefill_dense_weights sends launches of too few programs
    to "dequant"); at 4096 rows 12352 x 2048 807 / 307 / 417 (fused is bound by its dequantisation there, each
    weight once per 128 rows), hence "fused" only up to launch_table "affine.fused_max_rows" rows, "dequant" above.
    Below "affine.dequant_min_rows" rows the dequantisation of the whole weight costs more than it saves: "wide"."""
    if m < launch_value("affine.dequant_min_rows"):
        return "wide"
    return "dequant" if m > launch_value("affine.fused_max_rows") else "fused"


def dense_config(m: int) -> tuple[int, int, int, int, int, bool]:
    """(BM, BN, BK, num_warps, num_stages, TMA) of the dense kernel for m rows. The tile never changes a row's bits
    (each output element is the same chain of k16 MMAs in K order whatever the tile: GPU test over these and other
    tiles, and a probe (lab/NOTES.md) found every tile, cp.async or TMA, bit-equal to the wide kernel), so
    it may follow M. Tiles fetched by TMA in K steps of launch_table "affine.dense_bk" (64): "affine.dense_tile"
    (BM, BN, num_warps, num_stages; 128 x 64 of 4 warps, 4 stages), from "affine.dense_large_rows" rows (2048)
    "affine.dense_tile_large" (256 x 128 of 8 warps, 4 stages); what they won against on the H200 (lab/NOTES.md):
    the table's docs. Where TMA cannot serve (tma_ok), dense_mm fetches the same tiles by cp.async."""
    large = m >= launch_value("affine.dense_large_rows")
    bm, bn, warps, stages = launch_value("affine.dense_tile_large" if large else "affine.dense_tile")
    return bm, bn, launch_value("affine.dense_bk"), warps, stages, True


def tma_ok(t: torch.Tensor) -> bool:
    """Whether a 2-D tensor can back a TMA descriptor: on CUDA, unit column stride, 16-byte aligned base and row
    stride (dense_mm's tiles, wgmma_dense's x)."""
    row_bytes = t.stride(0) * t.element_size()
    return t.is_cuda and t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and row_bytes % 16 == 0


def dense_mm(x2: torch.Tensor, w: torch.Tensor, out: torch.Tensor, config=None) -> torch.Tensor:
    """out [M, N] = x2 [M, K] w [N, K]^T, both in x2's dtype (the dequantised weight of `dequantize`). config:
    (BM, BN, BK, num_warps, num_stages[, TMA]) instead of dense_config's; TMA true: the tiles fetched by tensor
    descriptors (_dense_mm_tma_kernel) where both operands allow it (tma_ok; not under the interpreter), else
    by cp.async (_dense_mm_kernel): the same bits either way."""
    m, k = x2.shape
    n = w.shape[0]
    if w.shape[1] != k or w.stride(-1) != 1 or x2.stride(-1) != 1 or w.dtype != x2.dtype:
        raise ValueError(f"dense_mm: w must be {x2.dtype} [N, {k}] with unit column stride, found {w.dtype} "
                         f"{tuple(w.shape)}")
    bm, bn, bk, warps, stages, *tma = config or dense_config(m)
    if k % bk:
        raise ValueError(f"dense_mm: BK {bk} must divide K {k}")
    if m and tma and tma[0] and not dot_f32() and tma_ok(x2) and tma_ok(w):
        from triton.tools.tensor_descriptor import TensorDescriptor

        _dense_mm_tma_kernel[(triton.cdiv(m, bm) * triton.cdiv(n, bn),)](
            TensorDescriptor.from_tensor(x2, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]), out, m, n, k,
            out.stride(0), BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages)
    elif m:
        _dense_mm_kernel[(triton.cdiv(m, bm) * triton.cdiv(n, bn),)](
            x2, w, out, m, n, k, x2.stride(0), w.stride(0), out.stride(0), BM=bm, BN=bn, BK=bk, F32=dot_f32(),
            num_warps=warps, num_stages=stages)
    return out


def _expert_subtiles(m: int, num_experts: int) -> int:
    """16-row sub-tiles per expert-matmul program, from the mean rows per expert: a tile is one expert's, so at
    ~16 rows per expert (T = 512 x top-8 over 256 experts) 64-row tiles would be three quarters empty. H200, that
    shape: SUB 1 / 2 / 4: gate/up 296 / 245 / 332 us, down 303 / 250 / 352 (lab/sweep_prefill_kernels.py)."""
    if m <= 16:
        return 1
    return 2 if m <= 32 * num_experts else 4


def _subtiles(m: int) -> int:
    """16-row sub-tiles per program: 1 for decode-sized M (more programs, pure bandwidth), up to 4 for prefill."""
    return 1 if m <= 16 else (2 if m <= 64 else 4)


def default_config(spec: WeightSpec, m: int) -> tuple[int, int, int, int]:
    """(BN, BK, num_warps, num_stages) of the 16-row kernel: the routed experts (affine_matmul_experts; dense weights
    reach it only through an explicit 4-tuple config, affine_matmul runs the wide kernel). None of these changes a
    row's arithmetic (module doc), only speed.

    Decode-sized M (measured when dense weights ran this kernel): measured on the H200 (lab/NOTES.md, M=1 N=8192 K=2048 q4g64): (32, 512, 4, 3) 18.1 us,
    (32, 256, 4, 4) 18.4, (64, 256, 8, 3) 21.6, (16, 512, 4, 3) 24.1, (32, 128, 4, 4) 23.2, 8 warps with
    (16, 512|1024) 43-44 us; all bit-identical. Dense bf16 with (32, 128) reaches 66% of the copy bandwidth."""
    if m > 16:
        return (64 if spec.n >= 64 else 16), spec.block_k(128), 4, 3
    if spec.bits == DENSE_BITS:
        return (16 if spec.n <= 2048 else (32 if spec.n <= 8192 else 64)), spec.block_k(128), 4, 3
    if spec.n > 8192:  # lm_head-sized: (64, 128) ran at 771 GB/s, (16, 512) at 447 (N=248320, K=2048, q4)
        return 64, spec.block_k(128), 4, 3
    return (16 if spec.n <= 2048 else 32), spec.block_k(512 if spec.bits <= 4 else 256), 4, 3


def _check_x(x: torch.Tensor, k: int, name: str) -> None:
    if x.shape[-1] != k:
        raise ValueError(f"{name}: input has {x.shape[-1]} features, the weight expects {k}")
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"{name}: activations must be bf16 or fp16, found {x.dtype}")


def _launch(x2, spec: WeightSpec, out, grid_t: int, sub: int, config, experts=None, x_repeat: int = 1):
    m, k = x2.shape[0] * x_repeat, spec.k
    bn, bk, warps, stages = config
    if k % bk or (spec.bits != DENSE_BITS and bk % spec.group and spec.group % bk):
        raise ValueError(f"affine config: BK {bk} must divide K {k} and nest with the group size {spec.group}")
    w, s = spec.w, spec.scales
    if experts is None:
        tiles = (x2, x2, x2, x2)  # unused pointers
        swe = sse = 0
    else:
        tiles = experts
        swe, sse = w.stride(0), s.stride(0)
    grid = (triton.cdiv(spec.n, bn), grid_t)
    _affine_mm_kernel[grid](
        x2, w, s, spec.biases, out, *tiles,
        m, spec.n, k, x_repeat,
        x2.stride(0), swe, w.stride(-2), sse, s.stride(-2), out.stride(0),
        BITS=spec.bits, GROUP=spec.group, BN=bn, BK=bk, SUB=sub,
        EXPERTS=experts is not None, F32=dot_f32(), num_warps=warps, num_stages=stages,
    )


def affine_matmul(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor | None, biases: torch.Tensor | None,
    bits: int, group_size: int, out: torch.Tensor | None = None, config: tuple | None = None,
) -> torch.Tensor:
    """y = x W^T. x [..., K] bf16/fp16; W packed uint32 [N, K*bits/32] with scales/biases [N, K/group]
    (bits 2/4/8), or dense [N, K] with bits=16 and scales = biases = None. Returns [..., N] in x's dtype.
    From launch_table "affine.dequant_min_rows" rows the weight is dequantised once and multiplied by `dense_mm`
    (`dense_path`), else the wide kernel runs (`wide_config`), with the same bits; config: the wide kernel's (BM,
    BN, BK, num_warps, num_stages, SWAP) to run it whatever M, or (BN, BK, num_warps, num_stages) for the 16-row
    kernel instead (benchmark sweeps)."""
    spec = WeightSpec(qweight, scales, biases, bits, group_size, "affine_matmul weight")
    if spec.w.dim() != 2:
        raise ValueError(f"affine_matmul: weight must be 2-D [N, packed K], found shape {tuple(qweight.shape)}")
    _check_x(x, spec.k, "affine_matmul")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, spec.k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if out is None:
        out = torch.empty(m, spec.n, dtype=x.dtype, device=x.device)
    if m:
        dense = config is None and spec.k % launch_value("affine.dense_bk") == 0
        if dense and dense_path(m) in ("dequant", "fused"):
            w = spec.w.to(x2.dtype).contiguous() if spec.bits == DENSE_BITS else dequantize(spec, dtype=x2.dtype)
            dense_mm(x2, w, out)
        elif config is None or len(config) == 6:
            _launch_wide(x2, spec, out, config)
        else:
            sub = _subtiles(m)
            _launch(x2, spec, out, triton.cdiv(m, 16 * sub), sub, config)
    return out.view(*lead, spec.n)


def dense_matmul(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T for a dense W [N, K], with the same batch-invariant kernel (cuBLAS picks algorithms by M)."""
    return affine_matmul(x, weight, None, None, DENSE_BITS, 1, out)


@triton.jit
def _write_tile_table(starts, total, ex, E, MAX_TILES, tile_e_ptr, tile_lo_ptr, tile_hi_ptr, R: tl.constexpr,
                      TB: tl.constexpr):
    # the tile table from each expert's sorted start and row count ([EP], experts >= E hold no rows), by one
    # program: _write_tile_table_share's one part of one
    _write_tile_table_share(starts, total, ex, E, MAX_TILES, tile_e_ptr, tile_lo_ptr, tile_hi_ptr, 0, 1, R, TB)


@triton.jit
def _tiles_hist_kernel(ids_ptr, counts_ptr, M, EP: tl.constexpr, BLOCK: tl.constexpr):
    # grid (cdiv(M, BLOCK),): counts[pid, e] = rows of this block routed to expert e (a histogram)
    pid = tl.program_id(0)
    r = pid * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(ids_ptr + r, mask=r < M, other=0).to(tl.int32)
    tl.store(counts_ptr + pid * EP + tl.arange(0, EP), tl.histogram(ids, EP, mask=r < M))


@triton.jit
def _tiles_columns_kernel(counts_ptr, offsets_ptr, totals_ptr, NB, E, EP: tl.constexpr, EB: tl.constexpr,
                          NBC: tl.constexpr):
    # grid (cdiv(E, EB),): experts pid * EB .. + EB - 1 (below E): offsets[b, e] = the rows of e in blocks < b (the
    # start of block b's run of e within e's sorted segment) and totals[e] = e's rows, from the counts [NB, EP]
    # read NBC blocks at a time. Integer sums: the same values in any order.
    ex = tl.program_id(0) * EB + tl.arange(0, EB)
    live_e = ex < E
    rb = tl.arange(0, NBC)
    run = tl.zeros((EB,), dtype=tl.int32)
    for b0 in range(0, NB, NBC):
        live = ((b0 + rb) < NB)[:, None] & live_e[None, :]
        at = (b0 + rb)[:, None] * EP + ex[None, :]
        c = tl.load(counts_ptr + at, mask=live, other=0)
        tl.store(offsets_ptr + at, run[None, :] + tl.cumsum(c, 0) - c, mask=live)
        run += tl.sum(c, axis=0)
    tl.store(totals_ptr + ex, run, mask=live_e)


@triton.jit
def _tiles_rank_kernel(ids_ptr, offsets_ptr, totals_ptr, starts_ptr, order_ptr, tile_e_ptr, tile_lo_ptr,
                       tile_hi_ptr, M, E, MAX_TILES, EP: tl.constexpr, BLOCK: tl.constexpr, R: tl.constexpr,
                       TB: tl.constexpr):
    # grid (NB,): block pid's rows to their sorted positions, start[e] + offsets[pid, e] + the rank among this
    # block's earlier rows of e (stable: blocks ascend, rows ascend within a block); and this program's share of
    # the tile table (_write_tile_table_share, part pid of NB).
    # starts_ptr: [NB, EP] scratch, this program's row of the experts' starts (a gather needs them in memory).
    pid = tl.program_id(0)
    nb = tl.num_programs(0)
    ex = tl.arange(0, EP)
    total = tl.load(totals_ptr + ex, mask=ex < E, other=0)
    starts = tl.cumsum(total, 0) - total
    tl.store(starts_ptr + pid * EP + ex, starts)
    r = pid * BLOCK + tl.arange(0, BLOCK)
    live = r < M
    ids = tl.load(ids_ptr + r, mask=live, other=0)
    # rows past M (the last block's) have higher indices than every live row, so they are never "earlier"
    earlier = (ids[None, :] == ids[:, None]) & (r[None, :] < r[:, None])
    rank = tl.sum(earlier.to(tl.int32), axis=1)
    tl.debug_barrier()  # the starts stored by every thread before any reads them back
    pos = tl.load(starts_ptr + pid * EP + ids, mask=live, other=0) + tl.load(offsets_ptr + pid * EP + ids, mask=live,
                                                                            other=0)
    tl.store(order_ptr + pos + rank, r, mask=live)
    _write_tile_table_share(starts, total, ex, E, MAX_TILES, tile_e_ptr, tile_lo_ptr, tile_hi_ptr, pid, nb, R, TB)


@triton.jit
def _write_tile_table_share(starts, total, ex, E, MAX_TILES, tile_e_ptr, tile_lo_ptr, tile_hi_ptr, part, parts,
                            R: tl.constexpr, TB: tl.constexpr):
    # the tile table's entries written by program `part` of `parts`: tile j of expert e by program (e + j) mod
    # parts, and the tail tiles of the TB-blocks part, part + parts, ... from the aligned start of the tail, so the
    # parts together write every entry once. By (e + j), an expert's tiles spread over the programs (pp512's shared
    # expert has 32: one program writing them all was the rank launch's longest loop), so each loops cdiv(max tiles
    # an expert, parts) times: a loop over tiles by expert, not a search per tile (the search over [tiles, EP]
    # pairs was ~70 us at 576 rows, lab/NOTES.md).
    per = (total + R - 1) // R  # tiles per expert
    cum = tl.cumsum(per, 0)
    first = cum - per  # expert e's tiles are first[e] .. cum[e] - 1
    off = (part - ex % parts + parts) % parts  # expert e's first tile index j that this program writes
    for j0 in range(0, tl.cdiv(tl.max(per, 0), parts)):
        j = j0 * parts + off
        mine = j < per
        lo = starts + j * R
        tl.store(tile_e_ptr + first + j, ex, mask=mine)
        tl.store(tile_lo_ptr + first + j, lo, mask=mine)
        tl.store(tile_hi_ptr + first + j, tl.minimum(starts + total, lo + R), mask=mine)
    # the unused tail: expert -1, with the bounds the reference's search gives (those of expert E - 1 extended)
    last = ex == E - 1
    st = tl.sum(tl.where(last, starts, 0), axis=0)
    ct = tl.sum(tl.where(last, total, 0), axis=0)
    cu = tl.sum(tl.where(last, cum, 0), axis=0)
    pe = tl.sum(tl.where(last, per, 0), axis=0)
    used = tl.sum(per, axis=0)
    for t0 in range(used - used % TB + part * TB, MAX_TILES, parts * TB):
        t = t0 + tl.arange(0, TB)
        lo = st + (t - (cu - pe)) * R
        tail = (t >= used) & (t < MAX_TILES)
        tl.store(tile_e_ptr + t, tl.full((TB,), -1, tl.int32), mask=tail)
        tl.store(tile_lo_ptr + t, lo, mask=tail)
        tl.store(tile_hi_ptr + t, tl.minimum(st + ct, lo + R), mask=tail)


@triton.jit
def _tiles_one_kernel(ids_ptr, tile_e_ptr, tile_lo_ptr, tile_hi_ptr, order_ptr, M, E, MAX_TILES, R: tl.constexpr,
                      EP: tl.constexpr, MP: tl.constexpr, TB: tl.constexpr):
    # one program for up to MP rows: the per-expert counts (a histogram), and the stable order as a sort of the
    # unique keys id * MP + row (padding rows sort last), then the tile table (_write_tile_table)
    r = tl.arange(0, MP)
    live = r < M
    ids = tl.load(ids_ptr + r, mask=live, other=EP).to(tl.int32)
    ex = tl.arange(0, EP)
    total = tl.histogram(ids, EP, mask=live)
    starts = tl.cumsum(total, 0) - total
    sk = tl.sort(ids * MP + r)
    tl.store(order_ptr + r, sk % MP, mask=live)
    _write_tile_table(starts, total, ex, E, MAX_TILES, tile_e_ptr, tile_lo_ptr, tile_hi_ptr, R, TB)


def expert_tiles(expert_ids: torch.Tensor, num_experts: int, rows_per_tile: int):
    """Row tiles for the expert matmul, built on the device without a host sync (graph-capturable): one launch up
    to launch_table "affine.tiles_one_max" rows, three past it; the same tensors as `expert_tiles_reference` either
    way.

    Rows are sorted by expert (stable), each expert's segment is cut into tiles of <= rows_per_tile rows.
    Returns (tile_e, tile_lo, tile_hi, order): tile t covers sorted rows [lo, hi) of expert tile_e[t] (-1 for the
    unused tail of the upper-bound tile count), order[i] = the output row of sorted row i. Ids must lie in
    [0, num_experts) (the router's contract). Why kernels: the torch form is ~25 small ops, ~0.5 ms of host time per
    MoE block on the H200 machine (20 ms of a 110 ms pp512 prefill).
    """
    m = expert_ids.numel()
    ids = expert_ids.reshape(-1)
    dev = ids.device
    ep = triton.next_power_of_2(num_experts)
    block = launch_value("affine.tile_block")
    nb = triton.cdiv(m, block)
    max_tiles = triton.cdiv(m, rows_per_tile) + min(num_experts, m)
    tile_e = torch.empty(max_tiles, dtype=torch.int32, device=dev)
    lo = torch.empty(max_tiles, dtype=torch.int32, device=dev)
    hi = torch.empty(max_tiles, dtype=torch.int32, device=dev)
    order = torch.empty(m, dtype=torch.int32, device=dev)
    if 0 < m <= launch_value("affine.tiles_one_max"):  # decode-sized batches: one launch, not three (same tensors)
        _tiles_one_kernel[(1,)](ids, tile_e, lo, hi, order, m, num_experts, max_tiles, R=rows_per_tile, EP=ep,
                                MP=max(16, triton.next_power_of_2(m)), TB=64, num_warps=8)
    elif m:  # three launches over blocks of `block` rows: counts [NB, EP] of each block, then offsets from them
        counts = torch.empty(nb, ep, dtype=torch.int32, device=dev)
        offsets = torch.empty(nb, ep, dtype=torch.int32, device=dev)
        starts = torch.empty(nb, ep, dtype=torch.int32, device=dev)
        totals = torch.empty(ep, dtype=torch.int32, device=dev)
        _tiles_hist_kernel[(nb,)](ids, counts, m, EP=ep, BLOCK=block, num_warps=4)
        columns = launch_value("affine.tile_columns")
        _tiles_columns_kernel[(triton.cdiv(num_experts, columns),)](
            counts, offsets, totals, nb, num_experts, EP=ep, EB=columns, NBC=launch_value("affine.tile_column_blocks"),
            num_warps=4)
        _tiles_rank_kernel[(nb,)](ids, offsets, totals, starts, order, tile_e, lo, hi, m, num_experts,
                                  max_tiles, EP=ep, BLOCK=block, R=rows_per_tile, TB=64, num_warps=4)
    return tile_e, lo, hi, order


def expert_tiles_reference(expert_ids: torch.Tensor, num_experts: int, rows_per_tile: int):
    """`expert_tiles` in torch ops (a stable argsort and prefix sums): the reference its kernels are tested against."""
    m = expert_ids.numel()
    ids = expert_ids.reshape(-1).to(torch.int64)
    order = torch.argsort(ids, stable=True).to(torch.int32)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device).scatter_add_(0, ids, torch.ones_like(ids))
    starts = torch.cumsum(counts, 0) - counts
    per = (counts + rows_per_tile - 1) // rows_per_tile
    cum = torch.cumsum(per, 0)
    max_tiles = triton.cdiv(m, rows_per_tile) + min(num_experts, m)
    t = torch.arange(max_tiles, device=ids.device)
    e = torch.searchsorted(cum, t, right=True)
    valid = e < num_experts
    ec = e.clamp(max=num_experts - 1)
    lo = starts[ec] + (t - (cum[ec] - per[ec])) * rows_per_tile
    hi = torch.minimum(starts[ec] + counts[ec], lo + rows_per_tile)
    tile_e = torch.where(valid, e, torch.full_like(e, -1)).to(torch.int32)
    return tile_e, lo.to(torch.int32), hi.to(torch.int32), order


def affine_matmul_experts(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor | None, biases: torch.Tensor | None,
    expert_ids: torch.Tensor, bits: int, group_size: int, x_repeat: int = 1, out: torch.Tensor | None = None,
    tiles: tuple | None = None,
) -> torch.Tensor:
    """Row m of the result = x[m // x_repeat] W[expert_ids[m]]^T for a stacked weight [E, N, K*bits/32] (scales,
    biases [E, N, K/group]) or dense [E, N, K] (bits 16). x [M / x_repeat, K]; expert_ids [M]; returns [M, N].

    x_repeat = k lets MoE prefill pass each token once for its k routed rows. Rows are grouped by expert inside
    (sorted, tiles of <= 64 rows); a row's value does not depend on the others (see module doc).
    tiles: `expert_tiles_for(expert_ids, E)` computed once and shared by the calls over the same ids (an MoE
    block's gate, up and down), instead of a sort per call.
    """
    spec = WeightSpec(qweight, scales, biases, bits, group_size, "affine_matmul_experts weight")
    if spec.w.dim() != 3:
        raise ValueError(f"affine_matmul_experts: weight must be 3-D [E, N, packed K], found {tuple(qweight.shape)}")
    _check_x(x, spec.k, "affine_matmul_experts")
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"affine_matmul_experts: x must be a 2-D row-major [rows, K] tensor, found {tuple(x.shape)}")
    m = expert_ids.numel()
    if m != x.shape[0] * x_repeat:
        raise ValueError(f"affine_matmul_experts: {m} expert ids for {x.shape[0]} rows x {x_repeat} repeats")
    num_e = spec.w.shape[0]
    if out is None:
        out = torch.empty(m, spec.n, dtype=x.dtype, device=x.device)
    if m:
        sub = _expert_subtiles(m, num_e)
        tiles = expert_tiles(expert_ids, num_e, 16 * sub) if tiles is None else tiles
        if tiles[0].numel() != triton.cdiv(m, 16 * sub) + min(num_e, m):
            raise ValueError(f"affine_matmul_experts: tiles were built for another row count or expert count "
                             f"({tiles[0].numel()} tiles for {m} rows over {num_e} experts)")
        _launch(x, spec, out, tiles[0].numel(), sub, default_config(spec, m), experts=tiles, x_repeat=x_repeat)
    return out


def expert_tiles_for(expert_ids: torch.Tensor, num_experts: int):
    """The tiles affine_matmul_experts builds for these ids (same rows-per-tile rule), to share across calls."""
    return expert_tiles(expert_ids, num_experts, 16 * _expert_subtiles(expert_ids.numel(), num_experts))

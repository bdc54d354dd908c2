"""Decode projections from a bf16 copy of the weight: a throughput deployment's mixer projections.

out [M, N] = x [M, K] W [N, K]^T for decode rows (one token per sequence), W the weight dequantised once
(triton_affine.dequantize: dequant_tile's values). The arithmetic is triton_affine.dense_mm's: one [BM, BK] x
[BK, BN] `tl.dot` a K step, chained in K order into one fp32 accumulator, so every output element is the same chain
of k16 MMAs whatever the tile, M or the other rows (dense_mm's invariant; GPU test: a row's bits == the same row of
a 512-row dense_mm at the prefill's config, i.e. the prefill's bits for that projection). What this adds:

  PDL    the kernel sits in the decode chain (triton_pdl's protocol: it opens first and waits before reading x)
  conv   the DeltaNet decode conv in the epilogue (gated_delta.triton_decode.conv_tile) on features < channels:
         the bits of this matmul followed by triton_decode.causal_conv (GPU test), one launch fewer a layer

Why: at 64 streams the q4 tensor-core GEMVs run far from their bytes (bench/NOTES.md: the in_proj 30 us for 14 MB
on the H200), while a bf16 copy, 3.6x the bytes, streams through a plain matmul. Only deployments that decode many
streams hold the copies (model/fast.py decides which); the batch-1 ones keep the q4 GEMVs.

The tile (DECODE_TILE) is fixed: BM = 64 rows of x (wgmma's M; fewer rows are masked), so a deployment's rows run
one compiled kernel at every batch size.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..gated_delta.triton_decode import DecodeConv, check_decode_conv, conv_tile_apply, conv_tile_inputs
from ..triton_common import dot_f32, mma
from ..triton_pdl import pdl_args, pdl_open, pdl_wait

DECODE_TILE = (64, 32, 128, 4, 3)  # (BM, BN, BK, num_warps, num_stages): never a row's bits (dense_mm's invariant)
DECODE_STAGES_LONG_K = 5  # stages for K > 2048 (the out projections' 4096)


def decode_tile(k: int = 2048) -> tuple[int, int, int, int, int]:
    """The launch tile for a weight of K columns: DECODE_TILE, with DECODE_STAGES_LONG_K stages past K = 2048. H100
    (scripts/probe_bf16_decode.py, 64 rows, graph timings past the L2, bench/NOTES.md): the in_proj 12352 x 2048
    20.1 us at BN 32 BK 128 NS 3 (BN 64 20.5, BN 16 23.0), q|k|v 9216 x 2048 15.7, the out projection 2048 x 4096
    9.9 at NS 5 (NS 3 14.9). Env DELTASERVE_DENSE_DECODE_TILE "BN,BK,NS" for A/B (BM 64 and 4 warps stay)."""
    env = os.environ.get("DELTASERVE_DENSE_DECODE_TILE")
    if not env:
        return DECODE_TILE if k <= 2048 else (*DECODE_TILE[:4], DECODE_STAGES_LONG_K)
    try:
        bn, bk, ns = (int(v) for v in env.split(","))
    except ValueError:
        raise ValueError(f"DELTASERVE_DENSE_DECODE_TILE must be 'BN,BK,NS', found {env!r}") from None
    return 64, bn, bk, 4, ns


def conv_early() -> bool:
    """Whether the conv epilogue's inputs are requested before the PDL wait (the default) or after the loop.
    Env DELTASERVE_DENSE_DECODE_CONV_EARLY=1|0 (never a bit)."""
    return os.environ.get("DELTASERVE_DENSE_DECODE_CONV_EARLY", "1") != "0"


@triton.jit
def _decode_mm_kernel(x_ptr, w_ptr, x_desc, w_desc, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                      cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C, stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, TMA: tl.constexpr, F32: tl.constexpr,
                      CONV: tl.constexpr, KCONV: tl.constexpr, CONV_EARLY: tl.constexpr,
                      PDL: tl.constexpr = False):
    # grid: (cdiv(N, BN), cdiv(M, BM)). Tiles by TMA (host descriptors; rows past M or N read as 0) or by pointer
    # loads (the interpreter, operands TMA cannot describe): the same dots on the same values either way.
    # CONV_EARLY: the conv's window and weights requested before the wait (they overlap the previous kernel's tail
    # and this one's loop), else after the loop.
    pdl_open(PDL)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    if CONV and CONV_EARLY:
        inputs = conv_tile_inputs(rows, rn, M, N, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C, stride_cwc, stride_cwk,
                                  stride_ps, stride_pc, stride_pk, KCONV)
    pdl_wait(PDL)  # x is the previous kernel's output
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if TMA:
        for k0 in range(0, K, BK):
            xa = x_desc.load([pid_m * BM, k0])
            wb = w_desc.load([pid_n * BN, k0])
            acc = tl.dot(xa, wb.T, acc)
    else:
        rk = tl.arange(0, BK)
        xp = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + rk[None, :]
        wp = w_ptr + rn.to(tl.int64)[:, None] * stride_wn + rk[None, :]
        for k0 in range(0, K, BK):
            xa = tl.load(xp + k0, mask=(rows < M)[:, None], other=0.0)
            wb = tl.load(wp + k0, mask=(rn < N)[:, None], other=0.0)
            acc = mma(xa, tl.trans(wb), acc, F32)
    if CONV:
        if not CONV_EARLY:
            inputs = conv_tile_inputs(rows, rn, M, N, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C, stride_cwc, stride_cwk,
                                      stride_ps, stride_pc, stride_pk, KCONV)
        conv_tile_apply(out_ptr, acc, rows, rn, M, N, stride_om, pool_ptr, C, inputs, stride_pk, KCONV)
    else:
        y = acc.to(tl.bfloat16).to(out_ptr.dtype.element_ty)  # bf16 results; an fp32 out holds them widened
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_om + rn[None, :], y,
                 mask=(rows < M)[:, None] & (rn < N)[None, :])


def _tma_ok(t: torch.Tensor) -> bool:
    row_bytes = t.stride(0) * t.element_size()
    return t.is_cuda and t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and row_bytes % 16 == 0


def dense_decode_mm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, conv: tuple | None = None,
                    tile: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """y = x W^T for decode rows x [..., K] bf16 and a bf16 W [N, K] (unit column stride); [..., N] in x's dtype,
    or into `out` ([M, N], bf16 or fp32: the same values widened; not fp32 with conv=).
    conv: triton_decode.DecodeConv (or the same tuple): x holds one token per sequence and features < channels come
    out as SiLU(causal conv) with the pool updated, equal to this matmul followed by causal_conv bit for bit.
    tile: (BM, BN, BK, num_warps, num_stages) instead of decode_tile() (never a row's bits)."""
    k = x.shape[-1]
    if w.dim() != 2 or w.shape[1] != k or w.stride(-1) != 1 or w.dtype != x.dtype:
        raise ValueError(f"dense_decode_mm: w must be {x.dtype} [N, {k}] with unit column stride, found {w.dtype} "
                         f"{tuple(w.shape)} strides {w.stride()}")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"dense_decode_mm: activations must be bf16, found {x.dtype}")
    n = w.shape[0]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    bm, bn, bk, warps, stages = tile or decode_tile(k)
    if tile is None:  # the library's BK lowered to one dividing K (a K step's width is never a bit on the GPU)
        while bk > 16 and k % bk:
            bk //= 2
    if k % bk:
        raise ValueError(f"dense_decode_mm: BK {bk} must divide K {k}")
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    elif (out.dtype not in (torch.bfloat16, torch.float32) or tuple(out.shape) != (m, n) or out.stride(-1) != 1
          or (conv is not None and out.dtype != x.dtype)):
        raise ValueError(f"dense_decode_mm: out must be bf16 (or fp32 without conv=) [{m}, {n}] with unit column "
                         f"stride, found {out.dtype} {tuple(out.shape)} strides {out.stride()}")
    if conv is not None:
        cv = DecodeConv(*conv)
        kconv = check_decode_conv(cv, m, n, x.dtype)
        conv_args = (cv.weight, cv.pool, cv.state_slots, cv.context_lens, cv.channels, *cv.weight.stride(),
                     *cv.pool.stride())
    else:
        kconv, conv_args = 4, (x2, x2, x2, x2, 0, 0, 0, 0, 0, 0)
    if m == 0:
        return out.reshape(*lead, n)
    tma = not dot_f32() and _tma_ok(x2) and _tma_ok(w)
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        descs = (TensorDescriptor.from_tensor(x2, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]))
    else:
        descs = (x2, w)  # unused pointers
    _decode_mm_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm))](
        x2, w, *descs, out, m, n, k, x2.stride(0), w.stride(0), out.stride(0), *conv_args, BM=bm, BN=bn, BK=bk,
        TMA=tma, F32=dot_f32(), CONV=conv is not None, KCONV=kconv, CONV_EARLY=conv_early(), num_warps=warps,
        num_stages=stages,
        **pdl_args(x2))
    return out.reshape(*lead, n)

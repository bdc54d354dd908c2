"""RMSNorm kernels (GPU): zero-centred RMSNorm, with an optional fused residual add, and the DeltaNet gated norm.

Same meaning and rounding points as `kernels/norm.py`:
  rms_norm:       y = bf16( x * rsqrt(mean(x^2) + eps) * (offset + w) )          (fp32 inside)
  add_rms_norm:   r = bf16(x + residual); y = rms_norm(r)  -> (y, r)           (the decoder layer's x + h, then norm)
  gated_rms_norm: y = bf16( bf16(w * bf16(x * rsqrt(mean(x^2) + eps))) * SiLU(z) ) per row of dv
One program per row (or per block of rows), the whole row in registers: a row's result never depends on others.
add_rms_norm sums x^2 by one pairwise tree (sum_of_squares), not tl.sum's layout-dependent order, so a kernel that
makes that norm itself from the row in another layout (the MoE router launch, moe/triton_decode NORM) gets the same
bits; rms_norm keeps tl.sum (TREE).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .quant.triton_gemv import pairwise_sums, prep_row
from .triton_common import residual_sum, rms_scaled
from .triton_pdl import pdl_args, pdl_open, pdl_wait


@triton.jit
def sum_of_squares(xf, BLOCK: tl.constexpr):
    """sum(xf * xf) of a row xf [BLOCK] fp32 (BLOCK a power of two, padding zeros) by one fixed pairwise tree: pair
    (2i, 2i + 1) as fma(x_2i, x_2i, x_2i+1^2) (the fused product spelled out, so no compiler choice), then
    pairwise_sums' levels within groups of 32 pairs, then over the groups. Every level is a sum over an axis of
    two, a + b whichever threads hold them, so any kernel holding the row in any layout gets the same bits:
    add_rms_norm and the router launch that makes the MoE's input norm itself (moe/triton_decode, NORM)."""
    a, b = tl.split(tl.reshape(xf, [BLOCK // 2, 2]))
    s1 = tl.fma(a, a, b * b)
    HALF: tl.constexpr = BLOCK // 2
    if HALF <= 32:
        s = pairwise_sums(tl.reshape(s1, [1, HALF]), 1, HALF)
    else:
        G: tl.constexpr = HALF // 32
        s = pairwise_sums(tl.reshape(pairwise_sums(tl.reshape(s1, [G, 32]), G, 32), [1, G]), 1, G)
    return tl.sum(s, axis=0)


@triton.jit
def rms_inverse(xf, N, eps, BLOCK: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) of a row xf [BLOCK] fp32 of N features (N a runtime value in every caller, so the
    division is the same instruction everywhere), x^2 summed by sum_of_squares: the add-norm's formula in the norm
    kernel and in the router launch that makes it (moe/triton_decode route_normed)."""
    return 1.0 / tl.sqrt(sum_of_squares(xf, BLOCK) / N + eps)


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, ro_ptr, N, stride_x, stride_r, stride_y, stride_ro, eps, offset,
                     xp_ptr, xs_ptr, HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PREP_BITS: tl.constexpr = 0,
                     PREP_GROUP: tl.constexpr = 64, PREP_XP: tl.constexpr = True, PDL: tl.constexpr = False,
                     TREE: tl.constexpr = True):
    # PREP_BITS > 0: also the decode GEMV's prep of the output row (quant.triton_gemv.prep_row, xp / xs rows of
    # N and N / PREP_GROUP), read back from y after a barrier so it is the prep kernel's code on the same values;
    # PREP_XP False: the group sums alone, made from the row in registers by pairwise_sums (prep_row's arithmetic,
    # whose order does not depend on the layout: the same bits without the round trip through memory).
    pdl_open(PDL)
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + row * stride_r + cols, mask=m, other=0.0)
        x = residual_sum(x, r, y_ptr.dtype.element_ty)
        tl.store(ro_ptr + row * stride_ro + cols, x, mask=m)
    xf = x.to(tl.float32)
    if TREE:  # the order another kernel can make (add_rms_norm's)
        inv = rms_inverse(xf, N, eps, BLOCK)
    else:
        inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    if PREP_BITS > 0 and not PREP_XP:  # the sums alone, from the registers: pairwise_sums' order is prep_row's
        y = rms_scaled(xf, inv, offset, w, y_ptr.dtype.element_ty)
        tl.store(y_ptr + row * stride_y + cols, y, mask=m)
        G: tl.constexpr = BLOCK // PREP_GROUP
        tl.store(xs_ptr + row * G + tl.arange(0, G),
                 pairwise_sums(tl.reshape(y.to(tl.float32), [G, PREP_GROUP]), G, PREP_GROUP))
    else:
        tl.store(y_ptr + row * stride_y + cols, rms_scaled(xf, inv, offset, w, y_ptr.dtype.element_ty), mask=m)
        if PREP_BITS > 0:
            tl.debug_barrier()  # the row's stores (every thread's) before its reads
            prep_row(y_ptr + row * stride_y, xp_ptr + row * BLOCK, xs_ptr + row * (BLOCK // PREP_GROUP), BLOCK,
                     PREP_BITS, PREP_GROUP, PREP_XP)


def _rows(x: torch.Tensor, n: int, name: str) -> torch.Tensor:
    if x.shape[-1] != n:
        raise ValueError(f"{name}: last axis {x.shape[-1]} != weight size {n}")
    x2 = x.reshape(-1, n)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


PREP_MAX_N = 8192  # the prep runs in the norm's one 4-warp program per row (prep_row's layout and bits)


def prep_supported(n: int, bits: int, group: int) -> bool:
    """Can rms_norm(prep=(bits, group)) prep rows of n features: bits 4 or 8, n a power of two (the norm's block
    is the prep's K), a multiple of the group, at most PREP_MAX_N."""
    return bits in (4, 8) and n % group == 0 and n & (n - 1) == 0 and n <= PREP_MAX_N


def _launch_norm(x2: torch.Tensor, res2: torch.Tensor | None, weight: torch.Tensor, y: torch.Tensor,
                 r_out: torch.Tensor | None, eps: float, offset: float, prep: tuple[int, int] | None, name: str,
                 sums_only: bool = False):
    """The one launch of rms_norm / add_rms_norm over rows x2 [R, N] (+ res2 -> r_out when given) into y; with
    prep = (bits, group) also the decode GEMV's prep of y: returns (xp [R, N], xs [R, N / group]) (xp None when
    sums_only: the group sums alone, the same bits), else None."""
    n = weight.numel()
    xp = xs = y  # unused without prep
    bits, group = prep or (0, 64)
    if prep is not None:
        if not prep_supported(n, bits, group):
            raise ValueError(f"{name} prep: bits {bits} / group {group} for N = {n} (bits 4 or 8, N a power "
                             f"of two, a multiple of the group and at most {PREP_MAX_N})")
        xs = torch.empty(x2.shape[0], n // group, dtype=torch.float32, device=x2.device)
        xp = xs if sums_only else torch.empty(x2.shape[0], n, dtype=torch.float32, device=x2.device)
    has_res = res2 is not None
    r_in, r_o = (res2, r_out) if has_res else (x2, y)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, r_in, weight, y, r_o, n, x2.stride(0), r_in.stride(0) if has_res else 0,
                                         y.stride(0), r_o.stride(0) if has_res else 0, eps, offset, xp, xs,
                                         HAS_RES=has_res, BLOCK=triton.next_power_of_2(n), PREP_BITS=bits,
                                         PREP_GROUP=group, PREP_XP=not sums_only, TREE=has_res,
                                         num_warps=4 if n <= 4096 or prep else 8,
                                         **pdl_args(x2))  # prep: the prep kernel's 4 warps (prep_row's bits)
    if prep is None:
        return None
    return (None, xs) if sums_only else (xp, xs)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 1.0,
             out: torch.Tensor | None = None, prep: tuple[int, int] | None = None):
    """x [..., N] -> [..., N] in x's dtype (= kernels.norm.rms_norm). prep = (bits, group): also returns the
    decode GEMV's prep of the output rows, (y, (xp [R, N], xs [R, N / group])) as quant.triton_gemv.prep_x would
    make them from y (the same bits), so a GEMV reading y (affine_gemv(..., prep=)) needs no prep launch."""
    n = weight.numel()
    x2 = _rows(x, n, "rms_norm")
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device) if out is None else out.view(x2.shape)
    made = _launch_norm(x2, None, weight, y, None, eps, offset, prep, "rms_norm")
    if prep is not None:
        return y.view(x.shape), made
    return y.view(x.shape)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 offset: float = 1.0, prep: tuple[int, int] | None = None, sums_only: bool = False):
    """r = x + residual (rounded to x's dtype), y = rms_norm(r). Returns (y, r); shapes [..., N]. prep = (bits,
    group): also the decode GEMV's prep of y, as rms_norm(prep=) makes it: (y, r, (xp, xs)); sums_only: xs alone
    (the same bits), (y, r, (None, xs)), for a consumer that reads only the group sums (the tensor-core MoE)."""
    n = weight.numel()
    if residual.shape != x.shape:
        raise ValueError(f"add_rms_norm: residual {tuple(residual.shape)} != x {tuple(x.shape)}")
    x2, r2 = _rows(x, n, "add_rms_norm"), _rows(residual, n, "add_rms_norm residual")
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    r_out = torch.empty_like(y)
    made = _launch_norm(x2, r2, weight, y, r_out, eps, offset, prep, "add_rms_norm", sums_only)
    if prep is not None:
        return y.view(x.shape), r_out.view(x.shape), made
    return y.view(x.shape), r_out.view(x.shape)


@triton.jit
def _gated_norm_kernel(x_ptr, z_ptr, w_ptr, y_ptr, R, N, H, stride_xt, stride_xh, stride_zt, stride_zh, stride_y,
                       eps, BR: tl.constexpr, BLOCK: tl.constexpr):
    # row r of the R = T * H rows is (token r // H, head r % H): x and z are read in place with their own token
    # and head pitches (a column view of the fused projection's output needs no copy)
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BLOCK)
    m = (rows < R)[:, None] & (cols < N)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    tok, head = r64 // H, r64 % H
    act = y_ptr.dtype.element_ty
    x = tl.load(x_ptr + tok * stride_xt + head * stride_xh + cols[None, :], mask=m, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    y = (x * inv[:, None]).to(act).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(act).to(tl.float32)
    y = (w[None, :] * y).to(act).to(tl.float32)
    z = tl.load(z_ptr + tok * stride_zt + head * stride_zh + cols[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + r64 * stride_y + cols[None, :], (y * (z / (1.0 + tl.exp(-z)))).to(act), mask=m)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """x, gate [..., dv] -> [..., dv] in x's dtype (= kernels.norm.gated_rms_norm). [T, H, dv] inputs are read in
    place with any token and head pitches (e.g. z, a column view of the fused in-projection's output), others as
    rows; y is contiguous."""
    n = weight.numel()
    if gate.shape != x.shape:
        raise ValueError(f"gated_rms_norm: gate {tuple(gate.shape)} != x {tuple(x.shape)}")
    shape = x.shape
    if x.dim() == 3 and x.shape[-1] == n and x.stride(-1) == 1 and gate.stride(-1) == 1:
        heads, (sxt, sxh), (szt, szh) = x.shape[1], x.stride()[:2], gate.stride()[:2]
    else:
        x, gate = _rows(x, n, "gated_rms_norm"), _rows(gate, n, "gated_rms_norm gate")
        heads, (sxt, sxh), (szt, szh) = 1, (x.stride(0), 0), (gate.stride(0), 0)
    rows = x.numel() // n
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device) if out is None else out.view(rows, n)
    if rows:
        block = triton.next_power_of_2(n)
        br = max(1, 2048 // block)
        _gated_norm_kernel[(triton.cdiv(rows, br),)](x, gate, weight, y, rows, n, heads, sxt, sxh, szt, szh,
                                                     y.stride(0), eps, BR=br, BLOCK=block, num_warps=4)
    return y.view(shape)

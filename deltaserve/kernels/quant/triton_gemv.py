"""Bandwidth-oriented affine (MLX layout) GEMV for decode: y = x W^T for M <= 16 rows of x.

Same meaning as `kernels/quant/affine.py::affine_linear` up to bf16 rounding of the dequantised weight (this kernel
never rounds w: it is closer to the exact product than the reference). Layout (see `kernels/triton_common.py`):
w uint32 [N, K*BITS/32] (32/BITS codes per word, lowest bits first), scales/biases [N, K/GROUP]; or a dense
[N, K] weight with BITS = 16.

Work split: a program owns BN output features and the FULL K (no split-K), for MB rows of x. K is a compile-time
constant, so the chunk loop is unrolled and every chunk's loads are independent and all in flight together.
Grid (cdiv(N, BN), cdiv(M, MB)): N = 512..8192 gives 64..1024 programs of 4 warps.

Cheap dequant, by the group factorisation  sum_k (s q_k + b) x_k = s * (sum_k q_k x_k) + b * (sum_k x_k):
per weight element one shift+mask, the exact int->fp32 trick (q | 0x4B000000 read as fp32 is 2^23 + q, minus 2^23)
and one FMA per row of x; s and b are applied once per group.

Batch invariance: a tile of codes has shape [BN, CG, GW, PACK] (rows, groups of the chunk, words per group, codes
per word) whatever M is, and row i of x is reduced against it by the same helper (`_row_part`) into its own
[BN, CG] fp32 accumulator, chunks added in order, groups summed once at the end. So a row's arithmetic depends on
(N, K, BITS, GROUP, BN, CG, num_warps) only, never on M or on which rows share the program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_common import DENSE_BITS, WeightSpec

MAX_ROWS = 16  # the GEMV regime; larger M belongs to triton_affine.affine_matmul (tensor cores)
MAGIC = 0x4B000000  # fp32 bits of 2^23: OR a code into its mantissa to read 2^23 + code
ROW_BLOCK = 8  # rows of x per program at most (M = 9..16 runs two row blocks, each reading W from L2)


@triton.jit
def _prep_kernel(x_ptr, xp_ptr, xs_ptr, stride_xm, stride_pm, stride_sm, K: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr):
    """grid (M,): row m of x -> xp[m, i, j] = fp32 x[m, j*PACK + i] * 2^-(BITS * (i % (PACK/2))) (the codes'
    order, code i of word j, pre-scaled by the power of two the shift-free decode leaves on code i: exact), and
    xs[m, g] = sum of the row's group g (fp32, one fixed order). Row pitches of xp / xs: stride_pm / stride_sm."""
    m = tl.program_id(0)
    PACK: tl.constexpr = 32 // BITS
    HALF: tl.constexpr = PACK // 2
    KW: tl.constexpr = K // PACK
    j = tl.arange(0, KW)
    i = tl.arange(0, PACK)
    xv = tl.load(x_ptr + m.to(tl.int64) * stride_xm + j[:, None] * PACK + i[None, :]).to(tl.float32)
    scale = ((127 - BITS * (i % HALF)) << 23).to(tl.float32, bitcast=True)  # 2^-(BITS*(i%HALF)), exactly
    tl.store(xp_ptr + m.to(tl.int64) * stride_pm + i[None, :] * KW + j[:, None], xv * scale[None, :])
    g = tl.arange(0, K // GROUP)
    e = tl.arange(0, GROUP)
    xg = tl.load(x_ptr + m.to(tl.int64) * stride_xm + g[:, None] * GROUP + e[None, :]).to(tl.float32)
    tl.store(xs_ptr + m.to(tl.int64) * stride_sm + g, tl.sum(xg, axis=1))


@triton.jit
def _code_dot(d, src, xi_ptr, magic, SH: tl.constexpr, BITS: tl.constexpr):
    """d + (code at bits [SH, SH+BITS) of src) * 2^SH * xi, exactly as d + q * x (xi carries 2^-SH).
    (src & mask) | 0x4B000000 read as fp32 is 2^23 + q*2^SH (the field lies inside the 23-bit mantissa); minus
    2^23 is exact. One LOP3 + FADD + FFMA per code: no shift, no bit-field extract, no I2F. magic (= 0x4B000000)
    is a kernel argument so that it sits in a register and the AND and the OR fuse into one LOP3 (a LOP3 takes
    one immediate)."""
    v = ((src & (((1 << BITS) - 1) << SH)) | magic).to(tl.float32, bitcast=True) - 8388608.0
    return d + v * tl.load(xi_ptr)


@triton.jit
def _word_offsets(c, CG: tl.constexpr, GW: tl.constexpr, BN: tl.constexpr):
    """Word index of chunk c as [BN, CG, GW] (the same for every row: the full shape fixes one layout for the
    codes, x and the products)."""
    g = c * CG + tl.arange(0, CG)
    j = tl.arange(0, GW)
    zn = tl.zeros((BN,), dtype=tl.int32)
    return zn[:, None, None] + g[None, :, None] * GW + j[None, None, :]


@triton.jit
def _row_part(p, ph, s, b, magic, xp_row, xs_row, wofs, c, KW: tl.constexpr, CG: tl.constexpr, BITS: tl.constexpr):
    """One row of x against chunk c: s * (q . x_g) + b * sum(x_g) per (feature, group), fp32 [BN, CG].
    p: the chunk's words [BN, CG, GW] (int32), ph = p >> 16 (codes of the upper half-word moved into the
    mantissa's reach); xp_row: the row's deinterleaved pre-scaled fp32 x (see _prep_kernel); xs_row: its group
    sums. Codes are added in order i = 0 .. PACK-1 per word, words summed per group by tl.sum."""
    PACK: tl.constexpr = 32 // BITS
    HALF: tl.constexpr = PACK // 2
    d = tl.zeros(p.shape, dtype=tl.float32)
    for i in tl.static_range(HALF):
        d = _code_dot(d, p, xp_row + i * KW + wofs, magic, BITS * i, BITS)
    for i in tl.static_range(HALF):
        d = _code_dot(d, ph, xp_row + (HALF + i) * KW + wofs, magic, BITS * i, BITS)
    g = c * CG + tl.arange(0, CG)
    xs = tl.load(xs_row + g)
    return s * tl.sum(d, axis=2) + b * xs[None, :]


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
def gemv_row(x_row, xp_row, xs_row, w_ptr, s_ptr, b_ptr, rn, n_mask, stride_wn, stride_sn, magic,
             K: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr):
    """W[rn, :K] . x as fp32 [BN] for ONE row of x, with exactly the per-row arithmetic of _gemv_kernel (same
    helpers, same chunking): x_row is the bf16 row (read for dense weights), xp_row/xs_row its _prep_kernel
    output (read for packed weights)."""
    rn64 = rn.to(tl.int64)
    if BITS == 16:
        BKD: tl.constexpr = CG * GROUP
        acc = tl.zeros((BN, BKD), dtype=tl.float32)
    else:
        PACK: tl.constexpr = 32 // BITS
        GW: tl.constexpr = GROUP // PACK
        KW: tl.constexpr = K // PACK
        acc = tl.zeros((BN, CG), dtype=tl.float32)
    for c in tl.static_range(K // (CG * GROUP)):
        if BITS == 16:
            kk = c * BKD + tl.arange(0, BKD)
            wv = tl.load(w_ptr + rn64[:, None] * stride_wn + kk[None, :], mask=n_mask[:, None],
                         other=0.0).to(tl.float32)
            acc += _dense_part(wv, x_row, c, BKD)
        else:
            wofs = _word_offsets(c, CG, GW, BN)
            p = tl.load(w_ptr + rn64[:, None, None] * stride_wn + wofs, mask=n_mask[:, None, None], other=0)
            g = c * CG + tl.arange(0, CG)
            sofs = rn64[:, None] * stride_sn + g[None, :]
            s = tl.load(s_ptr + sofs, mask=n_mask[:, None], other=0.0).to(tl.float32)
            b = tl.load(b_ptr + sofs, mask=n_mask[:, None], other=0.0).to(tl.float32)
            acc += _row_part(p, p >> 16, s, b, magic, xp_row, xs_row, wofs, c, KW, CG, BITS)
    return tl.sum(acc, axis=1)


@triton.jit
def _gemv_kernel(
    x_ptr, xp_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_sn, stride_om, magic,
    K: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr,
    MB: tl.constexpr,
):
    # grid (cdiv(N, BN), cdiv(M, MB)); rows m0 .. m0+MB-1 of x, each with its own accumulator (a0..a7). Rows past
    # M read row M-1 (valid memory) and are not stored.
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    n_mask = rn < N
    rn64 = rn.to(tl.int64)
    m0 = tl.program_id(1) * MB
    r0 = m0
    r1 = tl.minimum(m0 + 1, M - 1)
    r2 = tl.minimum(m0 + 2, M - 1)
    r3 = tl.minimum(m0 + 3, M - 1)
    r4 = tl.minimum(m0 + 4, M - 1)
    r5 = tl.minimum(m0 + 5, M - 1)
    r6 = tl.minimum(m0 + 6, M - 1)
    r7 = tl.minimum(m0 + 7, M - 1)
    if BITS == 16:
        BKD: tl.constexpr = CG * GROUP  # dense: chunks of BKD elements
        acc_shape: tl.constexpr = (BN, BKD)
    else:
        PACK: tl.constexpr = 32 // BITS
        GW: tl.constexpr = GROUP // PACK
        KW: tl.constexpr = K // PACK
        NG: tl.constexpr = K // GROUP
        acc_shape: tl.constexpr = (BN, CG)
    a0 = tl.zeros(acc_shape, dtype=tl.float32)
    a1 = tl.zeros(acc_shape, dtype=tl.float32)
    a2 = tl.zeros(acc_shape, dtype=tl.float32)
    a3 = tl.zeros(acc_shape, dtype=tl.float32)
    a4 = tl.zeros(acc_shape, dtype=tl.float32)
    a5 = tl.zeros(acc_shape, dtype=tl.float32)
    a6 = tl.zeros(acc_shape, dtype=tl.float32)
    a7 = tl.zeros(acc_shape, dtype=tl.float32)
    for c in tl.static_range(K // (CG * GROUP)):
        if BITS == 16:
            kk = c * BKD + tl.arange(0, BKD)
            wv = tl.load(w_ptr + rn64[:, None] * stride_wn + kk[None, :], mask=n_mask[:, None],
                         other=0.0).to(tl.float32)
            a0 += _dense_part(wv, x_ptr + r0.to(tl.int64) * stride_xm, c, BKD)
            if MB > 1:
                a1 += _dense_part(wv, x_ptr + r1.to(tl.int64) * stride_xm, c, BKD)
            if MB > 2:
                a2 += _dense_part(wv, x_ptr + r2.to(tl.int64) * stride_xm, c, BKD)
                a3 += _dense_part(wv, x_ptr + r3.to(tl.int64) * stride_xm, c, BKD)
            if MB > 4:
                a4 += _dense_part(wv, x_ptr + r4.to(tl.int64) * stride_xm, c, BKD)
                a5 += _dense_part(wv, x_ptr + r5.to(tl.int64) * stride_xm, c, BKD)
                a6 += _dense_part(wv, x_ptr + r6.to(tl.int64) * stride_xm, c, BKD)
                a7 += _dense_part(wv, x_ptr + r7.to(tl.int64) * stride_xm, c, BKD)
        else:
            wofs = _word_offsets(c, CG, GW, BN)
            p = tl.load(w_ptr + rn64[:, None, None] * stride_wn + wofs, mask=n_mask[:, None, None], other=0)
            g = c * CG + tl.arange(0, CG)
            sofs = rn64[:, None] * stride_sn + g[None, :]
            s = tl.load(s_ptr + sofs, mask=n_mask[:, None], other=0.0).to(tl.float32)
            b = tl.load(b_ptr + sofs, mask=n_mask[:, None], other=0.0).to(tl.float32)
            ph = p >> 16
            a0 += _row_part(p, ph, s, b, magic, xp_ptr + r0 * K, xs_ptr + r0 * NG, wofs, c, KW, CG, BITS)
            if MB > 1:
                a1 += _row_part(p, ph, s, b, magic, xp_ptr + r1 * K, xs_ptr + r1 * NG, wofs, c, KW, CG, BITS)
            if MB > 2:
                a2 += _row_part(p, ph, s, b, magic, xp_ptr + r2 * K, xs_ptr + r2 * NG, wofs, c, KW, CG, BITS)
                a3 += _row_part(p, ph, s, b, magic, xp_ptr + r3 * K, xs_ptr + r3 * NG, wofs, c, KW, CG, BITS)
            if MB > 4:
                a4 += _row_part(p, ph, s, b, magic, xp_ptr + r4 * K, xs_ptr + r4 * NG, wofs, c, KW, CG, BITS)
                a5 += _row_part(p, ph, s, b, magic, xp_ptr + r5 * K, xs_ptr + r5 * NG, wofs, c, KW, CG, BITS)
                a6 += _row_part(p, ph, s, b, magic, xp_ptr + r6 * K, xs_ptr + r6 * NG, wofs, c, KW, CG, BITS)
                a7 += _row_part(p, ph, s, b, magic, xp_ptr + r7 * K, xs_ptr + r7 * NG, wofs, c, KW, CG, BITS)
    _store_row(out_ptr, a0, rn, n_mask, m0, M, stride_om, 1)
    if MB > 1:
        _store_row(out_ptr, a1, rn, n_mask, m0 + 1, M, stride_om, 1)
    if MB > 2:
        _store_row(out_ptr, a2, rn, n_mask, m0 + 2, M, stride_om, 1)
        _store_row(out_ptr, a3, rn, n_mask, m0 + 3, M, stride_om, 1)
    if MB > 4:
        _store_row(out_ptr, a4, rn, n_mask, m0 + 4, M, stride_om, 1)
        _store_row(out_ptr, a5, rn, n_mask, m0 + 5, M, stride_om, 1)
        _store_row(out_ptr, a6, rn, n_mask, m0 + 6, M, stride_om, 1)
        _store_row(out_ptr, a7, rn, n_mask, m0 + 7, M, stride_om, 1)


def row_block(m: int) -> int:
    """Rows of x per program: the next power of two up to ROW_BLOCK (rows beyond M are masked)."""
    return min(ROW_BLOCK, triton.next_power_of_2(max(m, 1)))


def default_config(spec: WeightSpec) -> tuple[int, int, int]:
    """(BN, CG, num_warps). CG = groups per chunk (dense: CG * 64 elements per chunk). A chunk is
    BN * CG * GROUP codes, ~32 per thread at 4 warps; BN = 8 keeps >= 4 programs per SM from N = 4096
    (N = 512 gives 64 programs: these layers are latency-bound whatever the split)."""
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
                           num_warps=4)
    return xp, xs


def gemv_spec(qweight, scales, biases, bits: int, group: int, name: str) -> WeightSpec:
    spec = WeightSpec(qweight, scales, biases, bits, group, name)
    if spec.w.dim() != 2:
        raise ValueError(f"{name}: weight must be 2-D [N, packed K], found shape {tuple(qweight.shape)}")
    return spec


def launch_gemv(x2: torch.Tensor, spec: WeightSpec, out: torch.Tensor, config=None) -> None:
    """x2 [M, K] (K contiguous), out [M, N] (N contiguous); M <= MAX_ROWS is the intended regime."""
    m = x2.shape[0]
    bn, cg, warps = config or default_config(spec)
    group = unit(spec)
    if spec.k % (cg * group):
        raise ValueError(f"affine_gemv: chunk of {cg} x {group} must divide K = {spec.k}")
    mb = row_block(m)
    if spec.bits == DENSE_BITS:
        xp = xs = x2  # unused
    else:
        xp, xs = prep_x(x2, spec.bits, spec.group)
    grid = (triton.cdiv(spec.n, bn), triton.cdiv(m, mb))
    _gemv_kernel[grid](
        x2, xp, xs, spec.w, spec.scales, spec.biases, out, m, spec.n, x2.stride(0), spec.w.stride(0),
        spec.scales.stride(0), out.stride(0), MAGIC,
        K=spec.k, BITS=spec.bits, GROUP=group, BN=bn, CG=cg, MB=mb, num_warps=warps,
    )


def affine_gemv(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor | None, biases: torch.Tensor | None,
    bits: int, group: int, out: torch.Tensor | None = None, config: tuple | None = None,
) -> torch.Tensor:
    """y = x W^T for x [..., K] bf16/fp16 with at most MAX_ROWS rows; W packed uint32 [N, K*bits/32] with scales
    and biases [N, K/group] (bits 4 or 8, group 32/64/128), or dense [N, K] with bits=16 (scales = biases = None).
    Returns [..., N] in x's dtype (fp32 accumulation, rounded once). config: (BN, CG, num_warps) override."""
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
        launch_gemv(x2, spec, out.view(m, spec.n), config)
    return out.view(*lead, spec.n)

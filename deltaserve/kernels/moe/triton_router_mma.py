"""A prefill chunk's router logits on tensor cores: one arithmetic for every chunk size.

Why: the prefill router had to give the per-token decode router's bits (a chunk below router_rows_min() tokens
took that launch), so it repeated a CUDA-core FMA order (gluon_router_rows: 37 us a layer at 512 tokens, ~270 at
4,096, for 0.27 / 2.1 GFLOP; lab/NOTES.md). A prefill's other kernels are its own family already (the dense
projections' tiled matmul is not the decode GEMV's arithmetic), so the prefill router only has to agree with
itself across chunk sizes: chunked == whole. This kernel serves every prefill chunk, from one token up.

The arithmetic, per (token t, expert e), for an affine router (codes q, scale s and bias b per group of G):
  d_g  = MMA(x[t, g], q[e, g])     bf16 x, the codes exact in bf16 (at most 8 bits), fp32 accumulation: G / 16
                                   chained k16 steps of the tensor core, from zero
  xs_g = MMA(x[t, g], ones)        the group's sum of x, the same way
  logit = (...((0 + (s_0 d_0 + b_0 xs_0)) + (s_1 d_1 + b_1 xs_1)) + ...)   the groups in order, in fp32
which is x . (s q + b) re-associated (the reference's fp32 dequantised product). The tile shape (BT tokens x BE
experts, 4 warps: launch_table "router.mma_bt", "router.mma_be", "router.mma_warps") is fixed, never chosen by T,
and an MMA's output element depends on its row and column alone, so a token's logits never depend on the other
tokens of the chunk or on where in the tile it sits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch_table import value as launch_value
from ..triton_common import WeightSpec, dot_f32, mma

# The launch shape (launch_table): "router.mma_bt" tokens (the MMA's M) x "router.mma_be" experts (the MMA's N) a
# program of "router.mma_warps" warps, "router.mma_stages" stages of the K loop's software pipeline (never a bit).
# Launched without PDL (neither it nor its successor starts before its predecessor is done): a launch of 64 programs
# that each run the whole K loop is slowed by starting under PDL, not only by its successors starting early. H200,
# 35B-A3B q4 pp512 B=1 in its prefill graph (lab/NOTES.md): the router's critical time a layer without PDL 17.8 us,
# opening its successor after its K loop 41.6, first thing 53.9; pp512 B=1 early 24,279 / 25,435, off 25,304 /
# 26,666. Its codes come from a bf16 copy made once (router_codes_bf16, model/fast.router_codes: 1 MiB a 35B-A3B
# router), copied into shared memory as the MMA's operand with no unpacking in the loop (the same values, so the
# same bits as unpacking the words): H200 probe, 512 tokens 20.2 -> 13.9 us, 4,096 54.9 -> 42.3; 8 prompts +1.5%.


def router_codes_bf16(r: WeightSpec) -> torch.Tensor:
    """The codes q of the packed affine router r as bf16 [E, K] (exact: at most 8 bits): the MLX layout's
    (quant.affine.unpack_bits), code k of a row at bits (k % PACK) * BITS of word k // PACK for 4 and 8 bits, as
    the kernel unpacks them."""
    from ..quant.affine import unpack_bits

    return unpack_bits(r.w, r.bits).to(torch.bfloat16)


def router_mma_fits(x: torch.Tensor, r: WeightSpec) -> bool:
    """Whether this kernel serves router r for rows x: an affine router of 4 or 8 bits whose groups are whole MMA
    steps (16 | G, G | K), bf16 rows with unit column stride."""
    return (r.bits in (4, 8) and r.group % 16 == 0 and r.k % r.group == 0 and x.dtype == torch.bfloat16
            and x.dim() == 2 and x.shape[1] == r.k and x.stride(-1) == 1)


@triton.jit
def _group_dots(x_rows, w_rows, c_rows, g, t_mask, e_mask, ones, BITS: tl.constexpr, GROUP: tl.constexpr,
                BT: tl.constexpr, BE: tl.constexpr, F32: tl.constexpr, CODES: tl.constexpr):
    """(d, xs) of group g, each [BT, BE] fp32 from zero: the MMA of x's group with the codes, and with ones. The
    codes from the packed words (unpacked here) or, CODES, from their bf16 copy (the same values)."""
    xg = tl.load(x_rows + g * GROUP + tl.arange(0, GROUP)[None, :], mask=t_mask[:, None], other=0.0)  # [BT, G] bf16
    if CODES:
        qg = tl.load(c_rows + g * GROUP + tl.arange(0, GROUP)[None, :], mask=e_mask[:, None], other=0.0)  # [BE, G]
    else:
        PACK: tl.constexpr = 32 // BITS
        words = tl.load(w_rows + g * (GROUP // PACK) + tl.arange(0, GROUP // PACK)[None, :], mask=e_mask[:, None],
                        other=0)  # [BE, G / PACK]
        q = (words[:, :, None] >> (tl.arange(0, PACK) * BITS)[None, None, :]) & ((1 << BITS) - 1)  # code PACK j + i
        qg = tl.reshape(q, (BE, GROUP)).to(tl.float32).to(tl.bfloat16)  # exact: at most 8 bits
    zero = tl.zeros((BT, BE), dtype=tl.float32)
    return mma(xg, tl.trans(qg), zero, F32), mma(xg, ones, zero, F32)


@triton.jit
def _group_term(d, xs, s_ptr, b_ptr, re, e_mask, stride_sn, g):
    """s_g d + b_g xs [BT, BE] fp32 for the experts re of group g."""
    s = tl.load(s_ptr + re * stride_sn + g, mask=e_mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + re * stride_sn + g, mask=e_mask, other=0.0).to(tl.float32)
    return d * s[None, :] + xs * b[None, :]


@triton.jit(do_not_specialize=["T"])
def _router_mma_kernel(x_ptr, w_ptr, s_ptr, b_ptr, c_ptr, out_ptr, T, E, stride_xt, stride_wn, stride_sn,
                       stride_cn, stride_ot, K: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr,
                       BT: tl.constexpr, BE: tl.constexpr, STAGES: tl.constexpr, F32: tl.constexpr,
                       CODES: tl.constexpr = False):
    # grid (cdiv(T, BT), cdiv(E, BE)): program (i, j) writes logits [i BT .. i BT + BT, j BE .. j BE + BE] fp32.
    # x [T, K] bf16 rows; w [E, K / PACK] int32 words, code k of a row at bits (k % PACK) * BITS of word k // PACK;
    # s, b [E, K / GROUP]. Rows past T and experts past E read zeros and are not stored. CODES: the codes read from
    # c [E, K] bf16 (the same values as the words' codes, so never a bit), w unused. Launched without PDL (above).
    rt = tl.program_id(0) * BT + tl.arange(0, BT)
    re = tl.program_id(1) * BE + tl.arange(0, BE)
    t_mask = rt < T
    e_mask = re < E
    x_rows = x_ptr + rt.to(tl.int64)[:, None] * stride_xt
    w_rows = w_ptr + re[:, None] * stride_wn
    c_rows = c_ptr + re[:, None] * stride_cn
    ones = tl.full((GROUP, BE), 1.0, tl.float32).to(tl.bfloat16)
    acc = tl.zeros((BT, BE), dtype=tl.float32)
    for g in tl.range(0, K // GROUP, num_stages=STAGES):
        d, xs = _group_dots(x_rows, w_rows, c_rows, g, t_mask, e_mask, ones, BITS, GROUP, BT, BE, F32, CODES)
        acc = acc + _group_term(d, xs, s_ptr, b_ptr, re, e_mask, stride_sn, g)
    out = out_ptr + rt.to(tl.int64)[:, None] * stride_ot + re[None, :]
    tl.store(out, acc, mask=t_mask[:, None] & e_mask[None, :])


def router_mma_logits(x: torch.Tensor, r: WeightSpec, out: torch.Tensor | None = None,
                      codes: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 logits [T, E] of the T rows of x [T, K] bf16 for the affine router r (router_mma_fits must hold).
    codes: r's codes as bf16 [E, K] (router_codes_bf16(r)), read instead of unpacking the words (the same bits)."""
    if not router_mma_fits(x, r):
        raise ValueError(f"router_mma_logits: needs bf16 rows [T, {r.k}] with unit column stride and an affine "
                         f"router of 4 or 8 bits in groups of a multiple of 16; found x {x.dtype} "
                         f"{tuple(x.shape)} strides {x.stride()}, router {r.bits} bits, group {r.group}")
    t = x.shape[0]
    if out is None:
        out = torch.empty(t, r.n, dtype=torch.float32, device=x.device)
    elif out.dtype != torch.float32 or tuple(out.shape) != (t, r.n) or out.stride(-1) != 1:
        raise ValueError(f"router_mma_logits: out must be fp32 [{t}, {r.n}] with unit column stride, found "
                         f"{out.dtype} {tuple(out.shape)} strides {out.stride()}")
    if codes is not None and (codes.dtype != torch.bfloat16 or tuple(codes.shape) != (r.n, r.k)
                              or codes.stride(-1) != 1):
        raise ValueError(f"router_mma_logits: codes must be bf16 [{r.n}, {r.k}] with unit column stride, found "
                         f"{codes.dtype} {tuple(codes.shape)} strides {codes.stride()}")
    if t:
        c = r.w if codes is None else codes
        bt, be = launch_value("router.mma_bt"), launch_value("router.mma_be")
        _router_mma_kernel[(triton.cdiv(t, bt), triton.cdiv(r.n, be))](
            x, r.w, r.scales, r.biases, c, out, t, r.n, x.stride(0), r.w.stride(-2), r.scales.stride(-2), c.stride(0),
            out.stride(0), K=r.k, BITS=r.bits, GROUP=r.group, BT=bt, BE=be, STAGES=launch_value("router.mma_stages"),
            F32=dot_f32(), CODES=codes is not None, num_warps=launch_value("router.mma_warps"))
    return out

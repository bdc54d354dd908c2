"""The dense prefill projections as one warpgroup-MMA matmul that dequantises the q4 weight in registers.

Why: from DEQUANT_MIN_ROWS rows the dense projections (triton_affine.dense_path "dequant") write the whole weight
to bf16 first (`dequantize`, ~3.2 TB/s: the in_proj's 50 MB in ~20 us) and then multiply (`dense_mm`); at a
512-token prefill of the 35B-A3B that is ~1.1 ms of ~19.4 (bench/NOTES.md). Here the weight never exists in bf16
outside registers: a program owns 64 weight rows (RS = 2: two sets of 64) against BT rows of x, each weight group
is dequantised once per BT rows of x straight into the wgmma's A operand, and x is the B operand in shared memory.

Same bits as dequantise-then-multiply (and so as the wide kernel, whatever M): each weight element is dequant_tile's
value, fma(q, s, b) in fp32 rounded once to bf16, and each output element is the chain of k16 MMAs over
consecutive 16-column steps in K order from zero, rounded once to bf16, which is what dense_mm's tl.dot chains
(the H200 computes a k16 MMA's result the same whatever the tile, the operand order or the load path:
bench/NOTES.md, and the GPU test compares the two bit for bit). That needs each k16 step's 16 columns to be 16
consecutive columns, so the weight is repacked in the "natural" order (mma_gemv.repack_q4(order="natural")):
each thread's 128-bit load of a row block's group is its A fragments of the group's four k16 steps.

Batch invariance: a row of x is an MMA column; nothing mixes columns, so a row's bits never depend on M.
"""

from __future__ import annotations

import torch

from ...utils.env import env_int
from .. import backend
from ..triton_pdl import pdl_args
from .mma_gemv import GROUP, HAVE_GLUON

DENSE_TILE_ROWS = 128  # rows of x a program (the MMA's N)
DENSE_STAGES = 4  # shared-memory slots of a program's ring
DENSE_ROW_SETS = 1  # sets of 64 weight rows a program
DENSE_LAG = 1  # MMA steps left in flight while the next group is dequantised (0 or 1)


def dense_fits(n: int, k: int, bits: int, group: int) -> bool:
    """Whether a dense weight [N, K] can take this kernel: q4 g64 with N a multiple of 64 (a program's 64 rows) and
    Gluon present (sm_90 at run time)."""
    return HAVE_GLUON and bits == 4 and group == GROUP and n % 64 == 0 and k % GROUP == 0


if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, warpgroup_mma,
                                                                  warpgroup_mma_wait)

    from .mma_gemv import pdl_open, pdl_wait
    from .wgmma_experts import _wg_a_operand, bf16_pair

    @gluon.jit
    def _dense_a(w_sm, sbq, slot, zero_w, dot_a: gl.constexpr, RL: gl.constexpr):
        """A group's dequantised weight [64 rows, 64 columns] bf16 in the A operand's registers: the words from slot
        `slot` made 128 + q (exact in bf16), q = that - 128 (exact in fp32), then fma(q, s, b) of the row's (s, b)
        rounded once to bf16: dequant_tile's values."""
        a = _wg_a_operand(w_sm.index(slot).load(gl.SliceLayout(4, zero_w.type.layout)), zero_w, dot_a)
        s, b = bf16_pair(sbq.load(RL))
        s = gl.convert_layout(s, gl.SliceLayout(1, dot_a))
        b = gl.convert_layout(b, gl.SliceLayout(1, dot_a))
        q = a.to(gl.float32) - 128.0
        return gl.fma(q, gl.expand_dims(s, 1), gl.expand_dims(b, 1)).to(gl.bfloat16)

    @gluon.jit
    def _dense_issue(w_sm, x_sm, sb_sm, slot, w_src, x_src, sq_src, wmask, wmask2, xmask, sqmask, RS: gl.constexpr,
                     GW: gl.constexpr):
        """One group's copies into slot `slot`: the words of each row set (the second's under wmask2), x's [BT, 64]
        bf16, the (s, b) pairs; one cp.async group."""
        async_copy.async_copy_global_to_shared(w_sm.index(slot * RS), w_src, mask=wmask)
        if RS == 2:
            async_copy.async_copy_global_to_shared(w_sm.index(slot * RS + 1), w_src + 4 * GW * 128, mask=wmask2)
        async_copy.async_copy_global_to_shared(x_sm.index(slot), x_src, mask=xmask)
        async_copy.async_copy_global_to_shared(sb_sm.index(slot), sq_src, mask=sqmask)
        async_copy.commit_group()

    @gluon.jit
    def _wg_dense_mm_kernel(x_ptr, w_ptr, sbq_ptr, out_ptr, stride_xm, stride_om, M, NB, K: gl.constexpr,
                            BT: gl.constexpr, NS: gl.constexpr, RS: gl.constexpr, LAG: gl.constexpr,
                            PDL: gl.constexpr = False):
        """grid (cdiv(M, BT), cdiv(NB, 4 RS)): rows [t BT, t BT + BT) of x against row blocks 4 RS p .. of the
        weight (64 RS rows; a second set past NB reads and writes nothing). out [M, N] = x W^T in out's dtype.
        Each group's words, x and (s, b) go through NS shared-memory slots filled by cp.async; LAG = 1 leaves a
        group's MMAs in flight while the next group is dequantised (its slot refilled one step later)."""
        pdl_open(PDL)
        GW: gl.constexpr = K // 64  # groups
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        WL8: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4, 8], [1, 8, 4, 1, 1], [4, 1, 1, 1, 1], [4, 3, 2, 1, 0])
        WL: gl.constexpr = gl.SliceLayout(4, WL8)  # words [4 r, 8 rr, 4 c, 4 j]: one 16-byte copy a thread
        XL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # x [BT, 64] bf16: 16 bytes a copy
        SQL: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [2, 2], [1, 0])  # (s, b) pairs [2 sets, 64 rows]
        RL: gl.constexpr = gl.SliceLayout(1, mma)  # per weight row
        CL: gl.constexpr = gl.SliceLayout(0, mma)  # per row of x
        WSH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[3, 2, 1, 0])
        SSH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        SSH1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])  # the same bytes, read per set
        XSH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

        t = gl.program_id(0)
        p = gl.program_id(1).to(gl.int64)
        lo = t * BT
        rows = gl.minimum(M - lo, BT)
        blk = p * (4 * RS) * GW  # row block 4 RS p, group 0
        live2 = p * (4 * RS) + 4 < NB  # the second set's row blocks exist (RS = 2)
        wr = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, WL))))
        wrr = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, WL))))
        wc = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, WL))))
        wj = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, WL))))
        w_off = (wr[:, None, None, None] * (GW * 128) + wrr[None, :, None, None] * 16 + wc[None, None, :, None] * 4
                 + wj[None, None, None, :])
        w_base = w_ptr + blk * 128 + w_off
        wmask = w_off >= 0
        xn = gl.arange(0, BT, layout=gl.SliceLayout(1, XL))
        xk = gl.arange(0, 64, layout=gl.SliceLayout(0, XL))
        x_base = x_ptr + (gl.where(xn < rows, lo + xn, 0).to(gl.int64) * stride_xm)[:, None] + xk[None, :]
        xmask = (xn < rows)[:, None] & (xk >= 0)[None, :]
        # (s, b) of set k, row m = 16 r + 8 i1 + rr, as int32: (blk + (4 k + r) GW) 16 + g 16 + 2 rr + i1
        qk = gl.arange(0, 2, layout=gl.SliceLayout(1, SQL))
        qm = gl.arange(0, 64, layout=gl.SliceLayout(0, SQL))
        q_off = (blk * 16 + (qk * (4 * GW * 16))[:, None]
                 + ((qm // 16) * (GW * 16) + (qm % 8) * 2 + (qm // 8) % 2)[None, :])
        sq_base = sbq_ptr + q_off
        sqmask = ((qk < RS) & ((qk == 0) | live2))[:, None] & (qm >= 0)[None, :]
        wmask2 = wmask & live2

        w_sm = gl.allocate_shared_memory(gl.int32, [NS * RS, 4, 8, 4, 4], WSH)
        x_sm = gl.allocate_shared_memory(gl.bfloat16, [NS, BT, 64], XSH)
        sb_sm = gl.allocate_shared_memory(gl.int32, [NS, 2, 64], SSH)
        zero_w = gl.zeros([4, 8, 4, 4, 8], gl.int32, layout=WL8)
        acc = gl.zeros([64, BT], gl.float32, layout=mma)
        acc2 = acc
        # the A operands of the MMAs possibly still in flight (LAG): their registers are read asynchronously, so
        # they are carried into the next wait and not reused before it
        a_prev = gl.zeros([64, 64], gl.bfloat16, layout=dot_a)
        a2_prev = a_prev
        pdl_wait(PDL)  # x is the previous launch's output
        AHEAD: gl.constexpr = NS - 1 - LAG  # groups requested ahead of the one being computed
        for i in gl.static_range(AHEAD):
            _dense_issue(w_sm, x_sm, sb_sm, i, w_base + i * 128, x_base + i * 64, sq_base + i * 16, wmask, wmask2,
                         xmask, sqmask, RS, GW)
        for g in range(GW):
            slot = g % NS
            async_copy.wait_group(AHEAD - 1)  # this group's copies (this thread's), then everyone's, visible
            fence_async_shared()
            gl.thread_barrier()
            # refill: the slot of group g - 1 - LAG, whose MMAs every warp has waited for before the barrier. Past
            # the last group the last is copied again into a slot no later step reads (loop-invariant masks)
            nx = g + AHEAD
            nxc = gl.minimum(nx, GW - 1)
            _dense_issue(w_sm, x_sm, sb_sm, nx % NS, w_base + nxc * 128, x_base + nxc * 64, sq_base + nxc * 16,
                         wmask, wmask2, xmask, sqmask, RS, GW)
            b_sm = x_sm.index(slot).permute((1, 0))
            sbq = sb_sm.index(slot)._reinterpret(gl.int32, [128], SSH1)
            a = _dense_a(w_sm, sbq.slice(0, 64), slot * RS, zero_w, dot_a, RL)
            acc = warpgroup_mma(a, b_sm, acc, is_async=True)
            if RS == 2:
                a2 = _dense_a(w_sm, sbq.slice(64, 64), slot * RS + 1, zero_w, dot_a, RL)
                acc2 = warpgroup_mma(a2, b_sm, acc2, is_async=True)
                acc, acc2, a, a2, a_prev, a2_prev = warpgroup_mma_wait(LAG * 2, deps=[acc, acc2, a, a2, a_prev,
                                                                                       a2_prev])
                a2_prev = a2
            else:
                acc, a, a_prev = warpgroup_mma_wait(LAG, deps=[acc, a, a_prev])
            a_prev = a
        acc, acc2, a_prev, a2_prev = warpgroup_mma_wait(0, deps=[acc, acc2, a_prev, a2_prev])
        async_copy.wait_group(0)
        o_n = gl.arange(0, BT, layout=CL)
        o_row = gl.arange(0, 64, layout=RL)
        o_mask = (o_n < rows)[None, :] & (o_row >= 0)[:, None]
        o_ptr = out_ptr + (lo + o_n).to(gl.int64)[None, :] * stride_om + p * (64 * RS) + o_row[:, None]
        gl.store(o_ptr, acc.to(out_ptr.dtype.element_ty), mask=o_mask)
        if RS == 2:
            gl.store(o_ptr + 64, acc2.to(out_ptr.dtype.element_ty), mask=o_mask & live2)


def dense_tile_rows(m: int) -> int:
    """Rows of x a program (never a bit). Env DELTASERVE_WG_DENSE_ROWS (64, 128 or 256), for sweeps."""
    return env_int("DELTASERVE_WG_DENSE_ROWS", DENSE_TILE_ROWS, 64)


def wg_dense_mm(x: torch.Tensor, words: torch.Tensor, sb: torch.Tensor, out: torch.Tensor | None = None,
                tile_rows: int | None = None, stages: int | None = None, row_sets: int | None = None,
                lag: int | None = None) -> torch.Tensor:
    """out [M, N] = x [M, K] W^T for a weight repacked in the natural order (repack_q4(order="natural")), bf16 out:
    the bits of dequantize + dense_mm (module doc). tile_rows (64, 128 or 256), stages, row_sets (1 or 2) and lag
    (0 or 1) never change a bit (None: the module defaults, tile_rows from dense_tile_rows)."""
    if not HAVE_GLUON or backend.interpreting() or x.device.type != "cuda":
        raise RuntimeError("wg_dense_mm: needs a CUDA device (sm_90) and Triton's Gluon")
    if words.dim() != 3 or words.shape[2] != 128 or words.dtype != torch.int32 or words.shape[0] % 4:
        raise ValueError(f"wg_dense_mm: words must be int32 [N/16, K/64, 128] with N % 64 == 0, found {words.dtype} "
                         f"{tuple(words.shape)}")
    nb, g = words.shape[:2]
    n, k = nb * 16, g * GROUP
    if tuple(sb.shape) != (nb, g, 8, 2, 2) or not sb.is_contiguous() or sb.element_size() != 2:
        raise ValueError(f"wg_dense_mm: sb must be 16-bit [{nb}, {g}, 8, 2, 2] contiguous, found {sb.dtype} "
                         f"{tuple(sb.shape)}")
    if x.dim() != 2 or x.shape[1] != k or x.stride(-1) != 1 or x.dtype != torch.bfloat16 or x.stride(0) % 8:
        raise ValueError(f"wg_dense_mm: x must be bf16 [rows, {k}] with unit column stride and a row stride of 8s, "
                         f"found {x.dtype} {tuple(x.shape)} strides {x.stride()}")
    m = x.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    elif out.dtype != torch.bfloat16 or tuple(out.shape) != (m, n) or out.stride(-1) != 1:
        raise ValueError(f"wg_dense_mm: out must be bf16 [{m}, {n}] with unit column stride, found {out.dtype} "
                         f"{tuple(out.shape)} strides {out.stride()}")
    bt = tile_rows or dense_tile_rows(m)
    rs = row_sets or DENSE_ROW_SETS
    lag = DENSE_LAG if lag is None else lag
    ns = stages or DENSE_STAGES
    if bt not in (64, 128, 256) or rs not in (1, 2) or lag not in (0, 1) or ns < 2 + lag:
        raise ValueError(f"wg_dense_mm: tile_rows 64 / 128 / 256, row_sets 1 / 2, lag 0 / 1 and stages >= 2 + lag, "
                         f"found {bt}, {rs}, {lag}, {ns}")
    if m:
        _wg_dense_mm_kernel[(-(-m // bt), -(-nb // (4 * rs)))](
            x, words, sb.view(torch.int32), out, x.stride(0), out.stride(0), m, nb, K=k, BT=bt, NS=ns, RS=rs,
            LAG=lag, num_warps=4, **pdl_args(x))
    return out

"""The dense prefill projections as one warpgroup-MMA matmul that dequantises the q4 weight in registers.

Why: from launch_table "affine.dequant_min_rows" rows the dense projections (triton_affine.dense_path "dequant")
write the whole weight to bf16 first (`dequantize`, ~3.2 TB/s: the in_proj's 50 MB in ~20 us) and then multiply
(`dense_mm`); at a 512-token prefill of the 35B-A3B that is ~1.1 ms of ~19.4 (lab/NOTES.md). Here the weight never
exists in bf16 outside registers: a program owns 64 weight rows (RS = 2: two sets of 64) against BT rows of x, each
weight group is dequantised once per BT rows of x straight into the wgmma's A operand, and x is the B operand in
shared memory.

Same bits as dequantise-then-multiply (and so as the wide kernel, whatever M): each weight element is dequant_tile's
value, fma(q, s, b) in fp32 rounded once to bf16, and each output element is the chain of k16 MMAs over
consecutive 16-column steps in K order from zero, rounded once to bf16, which is what dense_mm's tl.dot chains
(the H200 computes a k16 MMA's result the same whatever the tile, the operand order or the load path:
lab/NOTES.md, and the GPU test compares the two bit for bit). That needs each k16 step's 16 columns to be 16
consecutive columns, so the weight is repacked in the "natural" order (mma_gemv.repack_q4(order="natural")):
each thread's 128-bit load of a row block's group is its A fragments of the group's four k16 steps.

Batch invariance: a row of x is an MMA column; nothing mixes columns, so a row's bits never depend on M.

H200 (a probe, CUDA graph past the L2, lab/NOTES.md), at 512 rows against dequantise +
multiply: 12352 x 2048 51.5 us / 66.6, 9216 x 2048 43.2 / 55.6, 2048 x 4096 33.1 / 25.9 (128 programs: too few,
enough_programs); the fp32 dequantisation instead of the bf16x2 fma 58.4 / 49.6 / 38.1. At 4,096 rows it is bound by
its dequantisation (each weight once per 128 rows of x): 417 / 307 us for the in_proj, hence dense_path's
"affine.fused_max_rows". An MMA left in flight over the next group's dequantisation gave wrong bits in a first form:
the A operand's registers were reused while the MMA still read them, so a group's MMAs are awaited first.
"""

from __future__ import annotations

import torch

from .. import backend
from ..launch_table import value as launch_value
from ..triton_pdl import pdl_args
from .mma_gemv import GROUP, HAVE_GLUON
from .triton_affine import tma_ok


def enough_programs(m: int, n: int) -> bool:
    """Whether m rows against an N-row weight make at least launch_table "dense_wgmma.fused_min_programs" (264: two a
    streaming multiprocessor of the H200's 132) programs of the default launch (rows of x a program, 64 weight rows):
    below that the GPU is not filled (H200, 512 rows: the 2048 x 4096 out projection's 128 programs 33.1 us against
    dequantise + multiply's 25.9; the in_proj's 772 51.5 against 66.6)."""
    return -(-m // dense_tile_rows()) * (n // 64) >= launch_value("dense_wgmma.fused_min_programs")


def dense_fits(n: int, k: int, bits: int, group: int) -> bool:
    """Whether a dense weight [N, K] can take this kernel: q4 g64 with N a multiple of 64 (a program's 64 rows) and
    Gluon present (sm_90 at run time)."""
    return HAVE_GLUON and bits == 4 and group == GROUP and n % 64 == 0 and k % GROUP == 0


def bf16_fma_exact(sb: torch.Tensor) -> bool:
    """Whether every weight value of a repacked weight's (s, b) pairs, q s + b for q = 0 .. 15, is exact in fp32.
    Then rounding it once to bf16 from infinite precision (one bf16x2 fma, BF16_FMA) gives the same bf16 as
    dequant_tile's fp32 fma rounded to bf16 (a double rounding that, from an exact fp32 value, is a single one).
    True for any quantiser's (s, b) whose scale and bias are within 2^12 of each other in magnitude (or b = 0);
    checked, not assumed, on the weight's device."""
    s = sb[..., 0].double().reshape(-1, 1)
    b = sb[..., 1].double().reshape(-1, 1)
    v = torch.arange(16, device=sb.device, dtype=torch.float64)[None, :] * s + b
    return bool(torch.equal(v.float().double(), v))


if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)

    from .mma_gemv import pdl_open, pdl_wait
    from .wgmma_gemv import _wg_a_operand, bf16_pair, wg_words_offsets

    # 8 codes of one word -> four bf16x2 registers of dequantised weights, in _DEQUANT_ASM's fragment order (pair k
    # = the nibbles at bits 4 k and 16 + 4 k, of row i1 = k % 2): 128 + q made as _DEQUANT_ASM does, q = that - 128
    # (exact), then one bf16x2 fma with the row's (s, s) and (b, b): q s + b rounded once to bf16. $4 is the word,
    # $12 / $20 rows i1 = 0's (s, s) / (b, b), $28 / $36 row i1 = 1's (the pack of 8 hands each input 8 times).
    _DENSE_DEQUANT_ASM = gl.constexpr(
        "{\n.reg .b32 t, u, one, m128;\nmov.b32 one, 0x3f803f80;\nmov.b32 m128, 0xc300c300;\n"
        + "".join((f"shr.b32 u, $4, {4 * k};\n" if k else "mov.b32 u, $4;\n")
                  + "lop3.b32 t, u, 0x000f000f, 0x43004300, 0xea;\n"  # 128 + q, the pair's two codes
                  + "fma.rn.bf16x2 t, t, one, m128;\n"  # q, exactly
                  + f"fma.rn.bf16x2 ${k}, t, {'$28, $36' if k % 2 else '$12, $20'};\n"  # q s + b, one rounding
                  for k in range(4))
        + "}")

    @gluon.jit
    def _pair2(p, HIGH: gl.constexpr):
        """(v, v) as bf16x2 of one half of a bf16 pair read as int32: the low half (s) or the high one (b)."""
        if HIGH:
            return ((p >> 16) & 65535) | (p & -65536)
        return (p & 65535) | (p << 16)

    @gluon.jit
    def _dense_a(w_sm, sb_set, p0, p1, slot, zero_w, dot_a: gl.constexpr, RL: gl.constexpr,
                 BF16_FMA: gl.constexpr):
        """A group's dequantised weight [64 rows, 64 columns] bf16 in the A operand's registers from slot `slot`
        (words w_sm.index(slot)): dequant_tile's values. BF16_FMA: one bf16x2 fma a pair (_DENSE_DEQUANT_ASM; only
        where bf16_fma_exact), with the (s, b) pairs p0 / p1 [4 r, 8 rr] of rows rr / rr + 8 in the words' layout;
        else 128 + q (_wg_a_operand), q = that - 128 and fma(q, s, b) in fp32 rounded once to bf16, with the pairs
        sb_set [64 rows] (int32, shared memory)."""
        words = w_sm.index(slot).load(gl.SliceLayout(4, zero_w.type.layout))
        if BF16_FMA:
            w8 = gl.broadcast(gl.expand_dims(words, 4), zero_w)[0]
            s0 = gl.broadcast(_expand3(_pair2(p0, False)), zero_w)[0]
            b0 = gl.broadcast(_expand3(_pair2(p0, True)), zero_w)[0]
            s1 = gl.broadcast(_expand3(_pair2(p1, False)), zero_w)[0]
            b1 = gl.broadcast(_expand3(_pair2(p1, True)), zero_w)[0]
            q = gl.inline_asm_elementwise(_DENSE_DEQUANT_ASM, "=r,=r,=r,=r" + ",r" * 40, [w8, s0, b0, s1, b1],
                                          dtype=gl.bfloat16, is_pure=True, pack=8)
            q = gl.permute(gl.reshape(q, [4, 8, 4, 4, 2, 2, 2]), [0, 5, 1, 3, 4, 2, 6])  # r i1 rr | j i2 c l
            return gl.convert_layout(gl.reshape(q, [64, 64]), dot_a, assert_trivial=True)
        a = _wg_a_operand(words, zero_w, dot_a)
        s, b = bf16_pair(sb_set.load(RL))
        s = gl.convert_layout(s, gl.SliceLayout(1, dot_a))
        b = gl.convert_layout(b, gl.SliceLayout(1, dot_a))
        q = a.to(gl.float32) - 128.0
        return gl.fma(q, gl.expand_dims(s, 1), gl.expand_dims(b, 1)).to(gl.bfloat16)

    @gluon.jit
    def _expand3(v):
        """[4, 8] -> [4, 8, 1, 1, 1] (the words' trailing axes)."""
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(v, 2), 3), 4)

    @gluon.jit
    def _dense_issue(x_desc, w_sm, x_sm, sb_sm, bars, slot, lo, g, w_src, sq_src, wmask, wmask2, sqmask, more,
                     RS: gl.constexpr, GW: gl.constexpr, BT: gl.constexpr):
        """Group g's copies into slot `slot`: x's [BT, 64] bf16 by TMA (rows past M read as 0) onto the slot's
        barrier, if `more`; the words of each row set (the second's under wmask2) and the (s, b) pairs by cp.async,
        one group (always: past the last group they copy it again into a slot nobody reads, with loop-invariant
        masks, and the wait counts stay alike). BF16_FMA reads its pairs by plain loads instead, so their copy here
        goes unread there, yet it stays: without it (840 SASS instructions against 872) the H200 ran the in_proj
        at 512 rows in 57.1 us against 51.5 and q|k|v in 53.5 against 43.2 (wave 38), so it likely brings the pairs
        into the caches NS - 1 groups before the plain loads want them."""
        mbarrier.expect(bars.index(slot), BT * 64 * 2, pred=more)
        tma.async_copy_global_to_shared(x_desc, [lo, g * 64], bars.index(slot), x_sm.index(slot), pred=more)
        async_copy.async_copy_global_to_shared(w_sm.index(slot * RS), w_src, mask=wmask)
        if RS == 2:
            async_copy.async_copy_global_to_shared(w_sm.index(slot * RS + 1), w_src + 4 * GW * 128, mask=wmask2)
        async_copy.async_copy_global_to_shared(sb_sm.index(slot), sq_src, mask=sqmask)
        async_copy.commit_group()

    @gluon.jit
    def _wg_dense_mm_kernel(x_desc, w_ptr, sbq_ptr, out_ptr, stride_om, M, NB, K: gl.constexpr, BT: gl.constexpr,
                            NS: gl.constexpr, RS: gl.constexpr, BF16_FMA: gl.constexpr, PDL: gl.constexpr = False):
        """grid (cdiv(M, BT), cdiv(NB, 4 RS)): rows [t BT, t BT + BT) of x against row blocks 4 RS p .. of the
        weight (64 RS rows; a second set past NB reads and writes nothing). out [M, N] = x W^T in out's dtype.
        Each group's x (by TMA), words and (s, b) (by cp.async; BF16_FMA reads the pairs by plain loads one group
        ahead) go through NS shared-memory slots, NS - 1 groups requested ahead; a group's MMAs are awaited before
        the next group is dequantised (the A operand's registers are read by the MMA asynchronously)."""
        pdl_open(PDL)
        GW: gl.constexpr = K // 64  # groups
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        WL8: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4, 8], [1, 8, 4, 1, 1], [4, 1, 1, 1, 1], [4, 3, 2, 1, 0])
        WL: gl.constexpr = gl.SliceLayout(4, WL8)  # words [4 r, 8 rr, 4 c, 4 j]: one 16-byte copy a thread
        SQL: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [2, 2], [1, 0])  # (s, b) pairs [2 sets, 64 rows]
        RL: gl.constexpr = gl.SliceLayout(1, mma)  # per weight row
        CL: gl.constexpr = gl.SliceLayout(0, mma)  # per row of x
        WSH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[3, 2, 1, 0])
        SSH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        SSH1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])  # the same bytes, read per set
        XSH: gl.constexpr = x_desc.layout

        t = gl.program_id(0)
        p = gl.program_id(1).to(gl.int64)
        lo = t * BT
        rows = gl.minimum(M - lo, BT)
        blk = p * (4 * RS) * GW  # row block 4 RS p, group 0
        live2 = p * (4 * RS) + 4 < NB  # the second set's row blocks exist (RS = 2)
        w_off = wg_words_offsets(WL, GW)
        w_base = w_ptr + blk * 128 + w_off
        wmask = w_off >= 0
        wmask2 = wmask & live2
        # (s, b) of set k, row m = 16 r + 8 i1 + rr, as int32: (blk + (4 k + r) GW) 16 + g 16 + 2 rr + i1
        qk = gl.arange(0, 2, layout=gl.SliceLayout(1, SQL))
        qm = gl.arange(0, 64, layout=gl.SliceLayout(0, SQL))
        q_off = (blk * 16 + (qk * (4 * GW * 16))[:, None]
                 + ((qm // 16) * (GW * 16) + (qm % 8) * 2 + (qm // 8) % 2)[None, :])
        sq_base = sbq_ptr + q_off
        sqmask = ((qk < RS) & ((qk == 0) | live2))[:, None] & (qm >= 0)[None, :]

        # BF16_FMA: the (s, b) pairs of rows rr and rr + 8 of each row block in the words' layout, from global
        # memory one group ahead: (blk + r GW) 16 + g 16 + 2 rr + i1
        RW: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, WL))  # [4 r, 8 rr]
        pr = gl.arange(0, 4, layout=gl.SliceLayout(1, RW))
        prr = gl.arange(0, 8, layout=gl.SliceLayout(0, RW))
        sbw = sbq_ptr + blk * 16 + (pr[:, None] * (GW * 16) + prr[None, :] * 2)
        sbw_mask2 = (pr >= 0)[:, None] & (prr >= 0)[None, :] & live2
        p0 = gl.zeros([4, 8], gl.int32, layout=RW)
        p1 = p0
        q0 = p0
        q1 = p0
        if BF16_FMA:
            p0 = gl.load(sbw)
            p1 = gl.load(sbw + 1)
            if RS == 2:
                q0 = gl.load(sbw + 4 * GW * 16, mask=sbw_mask2, other=0)
                q1 = gl.load(sbw + 4 * GW * 16 + 1, mask=sbw_mask2, other=0)

        w_sm = gl.allocate_shared_memory(gl.int32, [NS * RS, 4, 8, 4, 4], WSH)
        x_sm = gl.allocate_shared_memory(gl.bfloat16, [NS, BT, 64], XSH)
        sb_sm = gl.allocate_shared_memory(gl.int32, [NS, 2, 64], SSH)
        bars = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NS):
            mbarrier.init(bars.index(i), count=1)
        fence_async_shared()  # the barriers initialised before the copy engine signals them
        gl.thread_barrier()
        zero_w = gl.zeros([4, 8, 4, 4, 8], gl.int32, layout=WL8)
        acc = gl.zeros([64, BT], gl.float32, layout=mma)
        acc2 = acc
        pdl_wait(PDL)  # x is the previous launch's output
        for i in gl.static_range(NS - 1):
            _dense_issue(x_desc, w_sm, x_sm, sb_sm, bars, i, lo, i, w_base + i * 128, sq_base + i * 16, wmask,
                         wmask2, sqmask, i < GW, RS, GW, BT)
        for g in range(GW):
            slot = g % NS
            async_copy.wait_group(NS - 2)  # this group's words and (s, b) (this thread's copies)
            mbarrier.wait(bars.index(slot), (g // NS) & 1)  # and its x
            gl.thread_barrier()  # everyone's copies; every warp done with the slot refilled next (its MMAs awaited)
            nx = gl.minimum(g + NS - 1, GW - 1)
            _dense_issue(x_desc, w_sm, x_sm, sb_sm, bars, (g + NS - 1) % NS, lo, nx, w_base + nx * 128,
                         sq_base + nx * 16, wmask, wmask2, sqmask, g + NS - 1 < GW, RS, GW, BT)
            b_sm = x_sm.index(slot).permute((1, 0))
            sbq = sb_sm.index(slot)._reinterpret(gl.int32, [128], SSH1)
            a = _dense_a(w_sm, sbq.slice(0, 64), p0, p1, slot * RS, zero_w, dot_a, RL, BF16_FMA)
            acc = warpgroup_mma(a, b_sm, acc, is_async=True)
            if BF16_FMA:  # the next group's (s, b) pairs
                gn = gl.minimum(g + 1, GW - 1) * 16
                p0 = gl.load(sbw + gn)
                p1 = gl.load(sbw + gn + 1)
            if RS == 2:
                a2 = _dense_a(w_sm, sbq.slice(64, 64), q0, q1, slot * RS + 1, zero_w, dot_a, RL, BF16_FMA)
                if BF16_FMA:
                    q0 = gl.load(sbw + 4 * GW * 16 + gn, mask=sbw_mask2, other=0)
                    q1 = gl.load(sbw + 4 * GW * 16 + gn + 1, mask=sbw_mask2, other=0)
                acc2 = warpgroup_mma(a2, b_sm, acc2, is_async=True)
                acc, acc2, a, a2 = warpgroup_mma_wait(0, deps=[acc, acc2, a, a2])
            else:
                acc, a = warpgroup_mma_wait(0, deps=[acc, a])
        async_copy.wait_group(0)
        o_n = gl.arange(0, BT, layout=CL)
        o_row = gl.arange(0, 64, layout=RL)
        o_mask = (o_n < rows)[None, :] & (o_row >= 0)[:, None]
        o_ptr = out_ptr + (lo + o_n).to(gl.int64)[None, :] * stride_om + p * (64 * RS) + o_row[:, None]
        gl.store(o_ptr, acc.to(out_ptr.dtype.element_ty), mask=o_mask)
        if RS == 2:
            gl.store(o_ptr + 64, acc2.to(out_ptr.dtype.element_ty), mask=o_mask & live2)


def dense_tile_rows() -> int:
    """Rows of x a program (the MMA's N; never a bit): launch_table "dense_wgmma.tile_rows"."""
    return launch_value("dense_wgmma.tile_rows")


def dense_maxnreg() -> dict:
    """The kernel's register cap as a launch option (never a bit: it only decides what ptxas keeps in registers):
    none (138 registers at 128-row tiles, 3 programs an SM; at a cap of 128 4 fit, with 14 spill stores in sm_90's
    SASS)."""
    return {}


def wg_dense_mm(x: torch.Tensor, words: torch.Tensor, sb: torch.Tensor, out: torch.Tensor | None = None,
                bf16_fma: bool = False, tile_rows: int | None = None, stages: int | None = None,
                row_sets: int | None = None) -> torch.Tensor:
    """out [M, N] = x [M, K] W^T for a weight repacked in the natural order (repack_q4(order="natural")), bf16 out: the
    bits of dequantize + dense_mm (module doc). bf16_fma: dequantise by one bf16x2 fma a pair of weights, which gives
    those bits only where bf16_fma_exact(sb) (the caller's check, made once per weight). tile_rows (64, 128 or 256),
    stages (2+) and row_sets (1 or 2) never change a bit (None: tile_rows from dense_tile_rows, the others launch_table
    "dense_wgmma.stages" and "dense_wgmma.row_sets"). x's rows are fetched by TMA: a 16-byte aligned base and row
    stride."""
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
    if x.dim() != 2 or x.shape[1] != k or x.dtype != torch.bfloat16 or not tma_ok(x):
        raise ValueError(f"wg_dense_mm: x must be bf16 [rows, {k}] with unit column stride, a row stride of 8s and "
                         f"a 16-byte aligned base (TMA), found {x.dtype} {tuple(x.shape)} strides {x.stride()}")
    m = x.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    elif out.dtype != torch.bfloat16 or tuple(out.shape) != (m, n) or out.stride(-1) != 1:
        raise ValueError(f"wg_dense_mm: out must be bf16 [{m}, {n}] with unit column stride, found {out.dtype} "
                         f"{tuple(out.shape)} strides {out.stride()}")
    bt = tile_rows or dense_tile_rows()
    rs = row_sets or launch_value("dense_wgmma.row_sets")
    ns = stages or launch_value("dense_wgmma.stages")
    if bt not in (64, 128, 256) or rs not in (1, 2) or ns < 2:
        raise ValueError(f"wg_dense_mm: tile_rows 64 / 128 / 256, row_sets 1 / 2 and stages >= 2, found {bt}, {rs}, "
                         f"{ns}")
    if m:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        x_desc = TensorDescriptor.from_tensor(x, [bt, 64], layout)
        _wg_dense_mm_kernel[(-(-m // bt), -(-nb // (4 * rs)))](
            x_desc, words, sb.view(torch.int32), out, out.stride(0), m, nb, K=k, BT=bt, NS=ns, RS=rs,
            BF16_FMA=bool(bf16_fma), num_warps=4, **dense_maxnreg(), **pdl_args(x))
    return out

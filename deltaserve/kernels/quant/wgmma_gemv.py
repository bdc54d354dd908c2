"""The warpgroup-MMA (wgmma) program of the repacked q4 g64 matmuls on sm_90, with the bits of the tensor-core
(mma.sync) kernels, and its dense launch: the decode GEMV `wg_gemv`.

One Gluon program, `_wg_program`, serves two launches: `_wg_gemv_kernel` here (wg_gemv: one repack_q4 weight
against x's rows in order; tensor_core_gemv takes it from wg_gemv_rows(K) rows) and the MoE's experts matmul
(`moe/wgmma_experts.py`: stacked experts against the sorted tile table). The program, its Gluon helpers and the
launch settings both launches read (slots, the groups' order, register caps, groups a step, the staged group sums)
are here, under the dense launch, because quant/ may not import moe/; moe/wgmma_experts imports them.

A program owns 64 weight rows (four row blocks of 16, one per warp of the warpgroup) against BN rows of x (a tile:
BN consecutive rows of x, or BN sorted rows of one expert), so a weight word is dequantised once for up to BN rows
of x and x is read once per 64 weight rows (mma.sync: once per 16 or 32).

Same bits, by construction and by GPU test (tests/gpu/test_wgmma_experts_gpu.py): each output element is what the
mma.sync kernel (mma_gemv.mma_gemv; for the experts moe/mma_experts.mma_matmul_experts, the same arithmetic)
computes,
  per group g of 64 columns: qx = MMA(128 + q, x) from zero (the four k16 steps in the fragment order kk of the
  repacked layout, see mma_gemv's docstring), acc_w = fma(s, qx, acc_w), acc_w = fma(b - 128 s, xs, acc_w),
  with warp w of W taking groups w, w + W, ... in order, then the W partial sums added as Triton's cross-warp
  reduction adds them ((a0 + a2) + (a1 + a3), _wg_sum; checked against the mma.sync kernel on the GPU).
The weight is the A operand straight from registers: each warp's 128-bit load of a row block's group is exactly its
A fragment (the repacked layout), so the codes never pass through shared memory. x is the B operand in shared
memory, its 64 columns written in the fragment order kk, so each k16 step pairs the same codes with the same x
values in the same positions as the mma.sync kernel does.
"""

from __future__ import annotations


import torch

from .. import backend
from ..launch_table import value as launch_value
from ..triton_pdl import pdl_args
from .mma_gemv import GROUP, HAVE_GLUON

def _at_rows(table: tuple[tuple[int, int], ...], tile_rows: int) -> int | None:
    """The value of the first (ROWS, VALUE) entry of `table` that applies to tiles of tile_rows rows of x (tile_rows
    <= ROWS), or None where none does."""
    return next((value for rows, value in table if tile_rows <= rows), None)


def wg_maxnreg(tile_rows: int, dense: bool = False) -> dict:
    """The kernel's register cap as a launch option for tiles of tile_rows rows of x (never a bit: it only decides what
    ptxas keeps in registers), or {}: the first (tile rows up to, cap) entry of launch_table "moe_wgmma.maxnreg" that
    applies to the tile width, with the partial sums folded (wg_fold_pair; sm_90 without stack): the 8-row forms (a
    64-stream decode) at 96 registers, 5 programs an SM of the gated one (116 uncapped), the 16-row forms (a prefill of
    up to ~900 tokens) at 128, 4 of the gated one (163 uncapped; 24 bytes of stack outside its loops), the 32-row forms
    (prefills of thousands of tokens) at 168, 3 of the gated one instead of 2 (252 uncapped; 152 bytes of stack). H200
    (lab/NOTES.md): the gated launch at 512 tokens (graph probe) 163.6 -> 147.3 us with the fold, 159.1 with the cap
    alone; pp512 B=1 24,059 / 24,458 -> 24,548 / 24,883 tok/s, 8 prompts 38,811 -> 39,195; 64 streams 6,097 / 6,099 ->
    6,114 / 6,114 (128@8: 6,110). 168@32: the gated launch at 4,096 tokens 795.9 -> 750.1 us, 8 prompts 39,223 / 39,295
    -> 39,766 / 39,926 (+1.5%), 64 prompts 38,349 -> 38,231 (-0.3%). Before the fold: 128@8 alone (the 8-row gated form
    at 141 registers, 3 -> 4 programs an SM) 64 streams 5,103 -> 5,131; every launch capped (the 16- and 32-row forms
    spill 104-136 bytes) 4,921, and pp512 20,847 -> 20,252.
    dense (wg_gemv's launches): "gemv_wgmma.maxnreg" (sm_90: its 32-row form, a 64-stream decode's, 125 registers
    uncapped, 4 programs an SM, and 150 under a 168 cap)."""
    cap = _at_rows(launch_value("gemv_wgmma.maxnreg" if dense else "moe_wgmma.maxnreg"), tile_rows)
    return {} if cap is None else {"maxnreg": cap}


def wg_partial_major() -> bool:
    """Whether the kernel takes a K split's groups partial sum by partial sum (warp w's groups w, w + W, ... in turn,
    one partial sum updated at a time) instead of in K order; each partial sum adds its groups in the same order, so
    the same bits. sm_90: the gated form at 16-row tiles 255 -> 165 registers (3 programs an SM instead of 2), 8-row
    tiles 167 -> 141. The default: H200, pp512 @ d0 in one call (lab/NOTES.md), B=1 19,912 (group) -> 20,498
    tok/s, 8 prompts 27,776 -> 28,843; the GPU tests compare both orders with the mma.sync kernel bit for bit."""
    return True


def wg_fold_pair() -> bool:
    """Whether a partial-major program of the kernel with W = 4 takes its partial sums in the order 0, 2, 1, 3 and
    adds 0 and 2 as soon as both are complete (the first add of _wg_sum's (a0 + a2) + (a1 + a3)), so it holds three
    partial sums a weight instead of four. Each partial sum adds the same groups in the same order and the final
    sum is the same adds, so never a bit (GPU tests: fold == mma.sync). sm_90: the gated form at 8 / 16 / 32-row
    tiles 124 / 167 / 255 (+16 bytes of stack) -> 116 / 163 / 252 registers, wg_gemv at 32-row tiles 164 -> 125; what
    it buys is the register caps it lets through without spills in the loops (wg_maxnreg). H200, graph probe: the
    gated launch at 512 tokens 163.6 -> 160.3 us alone, 147.3 with the 128 cap; at 4,096 (32-row tiles) 807.3 ->
    797.4."""
    return True


def wg_xs_smem() -> bool:
    """Whether the kernel's launches with x's group sums given stage a tile's sums of every group in shared memory
    once (with the first group's copies) instead of loading them from global memory each step (BN / 4 loads a
    thread, each with its 64-bit address: sm_90 SASS of the 32-row dense form, 8 LDG and ~16 address instructions of
    a step's 209). The same values, so never a bit. The default: H200 (lab/NOTES.md), the in_proj at 64 rows
    25.6 -> 21.0 us, the lm_head 476 -> 392; 64 streams 5,208 -> 5,306 tok/s, with wg_slot_carry 5,421."""
    return True


def wg_slot_carry() -> bool:
    """Whether the kernel carries a step's shared-memory slot (and the one it refills) from step to step instead of
    computing step % NS and (step + NS - 1) % NS: at NS = 3 each is a multiply-shift division, ~18 uniform
    instructions of a step's ~170 (sm_90 SASS of the 32-row dense form). The same slots, so never a bit. The
    default: H200, 64 streams with the staged sums 5,306 -> 5,421 tok/s (lab/NOTES.md)."""
    return True


def wg_step_groups(tile_rows: int, groups: int, warps: int, dense: bool = False, down: bool = False) -> int:
    """Groups of 64 columns a loop step of the kernel takes for tiles of tile_rows rows of x over `groups` groups
    with the K split `warps` (never a bit: each group's MMAs and FMAs are the same, in the same order; only the
    copies' grouping and the barriers per group change): 1 or 2, where it divides the groups of a K split's run
    (groups // warps), else 1, one per launch (launch_table): the MoE's gated gate/up "moe_wgmma.step_groups", its
    down (down=True, the plain or scaled launch) "moe_wgmma.down_step_groups", wg_gemv (dense=True)
    "gemv_wgmma.step_groups". sm_90 SASS at 2: the 8-row gated MoE step 166 -> ~145 instructions a group, the
    32-row dense step 153 -> ~127, one barrier set per two groups. H200 (lab/NOTES.md): 64 streams
    tg64 @ d512 5,624 / 5,636 (1) -> 5,773 / 5,770 (2 everywhere), 5,732 (2 for 8-row tiles only); at a prefill's
    16-row tiles (CUDA-graph probe, 512 / 4,096 tokens) the gated launch 175.2 -> 161.6 / 987.0 -> 910.3 us with
    2, down 113.9 -> 126.6 / 679.8 -> 826.6, hence one switch a launch; down with two row sets (wg_row_sets) at a
    64-stream decode's 8-row tiles 48.3 us with 2, 45.5 with 1, and in the model 5,983 / 6,017 tok/s."""
    name = "gemv_wgmma.step_groups" if dense else "moe_wgmma.down_step_groups" if down else "moe_wgmma.step_groups"
    gs = launch_value(name)
    return gs if (groups // warps) % gs == 0 else 1


def _wg_slots(stages: int, groups: int, gs: int) -> int:
    """The kernel's NS (slots of gs groups each) for `stages` slots of one group: the same groups in flight,
    (stages - 1), rounded up to whole steps; at most every step in flight."""
    return min(1 + -(-(stages - 1) // gs), groups // gs + 1)


if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, warpgroup_mma,
                                                                  warpgroup_mma_wait)

    from .mma_gemv import _DEQUANT_ASM, _arrival, _conv_epilogue, _silu_mul, pdl_open, pdl_wait

    @gluon.jit
    def wg_words_offsets(WL: gl.constexpr, GW: gl.constexpr):
        """A group's words of four row blocks [4 r, 8 rr, 4 c, 4 j] as int32 offsets from row block 0's group 0 in a
        repacked weight of GW groups a row block (r GW 128 + lane 4 + j, lane = 4 rr + c): one 16-byte copy a
        thread. The experts kernel's and the dequantising dense matmul's (wgmma_dense)."""
        wr = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, WL))))
        wrr = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, WL))))
        wc = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, WL))))
        wj = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, WL))))
        return (wr[:, None, None, None] * (GW * 128) + wrr[None, :, None, None] * 16 + wc[None, None, :, None] * 4
                + wj[None, None, None, :])

    @gluon.jit
    def _wg_a_operand(words, zero_w, dot_a: gl.constexpr):
        """A group's words [4 warps, 8 rr, 4 c, 4 j] -> the A operand [64 rows, 64 kk] (128 + q as bf16) in
        registers: row 16 r + 8 i1 + rr, column kk = 16 j + 8 i2 + 2 c + l (mma_gemv._chunk_acc's order)."""
        w8 = gl.broadcast(gl.expand_dims(words, 4), zero_w)[0]
        q = gl.inline_asm_elementwise(_DEQUANT_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [w8], dtype=gl.bfloat16,
                                      is_pure=True, pack=8)
        q = gl.permute(gl.reshape(q, [4, 8, 4, 4, 2, 2, 2]), [0, 5, 1, 3, 4, 2, 6])  # r i1 rr | j i2 c l
        return gl.convert_layout(gl.reshape(q, [64, 64]), dot_a, assert_trivial=True)

    @gluon.jit
    def bf16_pair(v):
        """(low, high) fp32 of bf16 pairs read as int32 (the lower address in the low half): exact. The kernels'
        (s, b) pairs, and the Gluon router rows' x (moe/gluon_router_rows)."""
        return (v << 16).to(gl.float32, bitcast=True), (v & -65536).to(gl.float32, bitcast=True)

    @gluon.jit
    def _wg_group_fma(acc, qx, sb, xsum):
        """acc + one group's MMA result qx: fma(s, qx, acc), then fma(b - 128 s, sum(x), acc) (mma_gemv._chunk_acc's
        two FMAs in that order; the codes came in as 128 + q)."""
        s, b = sb
        acc = gl.fma(s[:, None], qx, acc)
        return gl.fma(gl.fma(s, -128.0, b)[:, None], xsum, acc)

    @gluon.jit
    def _wg_partial_fma(a0, a1, a2, a3, w: gl.constexpr, qx, sb, xsum):
        """The four partial sums with group result qx added into partial sum w (_wg_group_fma), the others as they
        were."""
        if w == 0:
            a0 = _wg_group_fma(a0, qx, sb, xsum)
        elif w == 1:
            a1 = _wg_group_fma(a1, qx, sb, xsum)
        elif w == 2:
            a2 = _wg_group_fma(a2, qx, sb, xsum)
        else:
            a3 = _wg_group_fma(a3, qx, sb, xsum)
        return a0, a1, a2, a3

    @gluon.constexpr_function
    def _wg_rev(i, W):
        """The partial sum that a partial-major program takes i-th: i with its log2(W) bits reversed (W = 4: 0, 2, 1,
        3), so that the first two (0 and 2) are the pair that _wg_sum adds first and fold into one (FOLD)."""
        return ((i & 1) << 1) | (i >> 1) if W == 4 else i

    @gluon.constexpr_function
    def _wg_group(step, W, NCH, PARTIAL_MAJOR, FOLD):
        """The group a prologue step requests: the step itself, or partial sum by partial sum (step i NCH + c is
        group c W + i, or with FOLD c W + _wg_rev(i, W))."""
        return (step % NCH) * W + (_wg_rev(step // NCH, W) if FOLD else step // NCH) if PARTIAL_MAJOR else step

    @gluon.jit
    def _wg_step_group(step, W: gl.constexpr, NCH: gl.constexpr, FOLD: gl.constexpr):
        """_wg_group of a partial-major step known at run time."""
        if FOLD:
            i = step // NCH
            return (step % NCH) * W + (((i & 1) << 1) | (i >> 1))  # _wg_rev at W = 4
        return (step % NCH) * W + step // NCH

    @gluon.jit
    def _wg_advance(w_sm, w2_sm, xq_sm, sb_sm, slot, nx, more, w_base, w2_base, x_base, sq_base, wmask, xq_mask,
                    sq_mask, NS: gl.constexpr, GATED: gl.constexpr, GS: gl.constexpr = 1, DG: gl.constexpr = 1):
        """Before a step: its groups' copies complete (this thread's, then everyone's) and visible to the MMAs; then
        the GS groups nx, nx + DG, ... requested into slot `slot` of buffers 0 .. GS - 1 (the slot of the step
        before, whose MMAs finished before the barrier), as one cp.async group, empty when not `more` (past the last
        step, so every wait counts alike)."""
        async_copy.wait_group(NS - 2)
        fence_async_shared()
        gl.thread_barrier()
        _wg_issue(w_sm, w2_sm, xq_sm, sb_sm, slot, w_base + nx * 128, w2_base + nx * 128, x_base + nx * 32,
                  sq_base + nx * 16, wmask & more, xq_mask & more, sq_mask & more, GATED, GS, DG)

    @gluon.jit
    def _wg_step(a0, a1, a2, a3, c0, c1, c2, c3, w: gl.constexpr, slot, xs, w_sm, w2_sm, xq_sm, sb_sm, zero_w, zero,
                 ones, dot_a: gl.constexpr, RL: gl.constexpr, XSH: gl.constexpr, SSH1: gl.constexpr,
                 BN: gl.constexpr, GATED: gl.constexpr, SELF_XS: gl.constexpr, PAIRED: gl.constexpr = False,
                 SPLIT_WAIT: gl.constexpr = False):
        """One group from slot `slot` into partial sum w (gate's a, up's c; PAIRED: the first and second row set's):
        its MMAs (gate, up, and the group sums' when SELF_XS) issued together and awaited once, then
        _wg_group_fma."""
        SPLIT: gl.constexpr = SPLIT_WAIT and (GATED or PAIRED) and not SELF_XS  # two waits (wg_split_wait)
        b_sm = xq_sm.index(slot)._reinterpret(gl.bfloat16, [BN, 64], XSH).permute((1, 0))
        sbq = sb_sm.index(slot)._reinterpret(gl.int32, [128], SSH1)
        a = _wg_a_operand(w_sm.index(slot).load(gl.SliceLayout(4, zero_w.type.layout)), zero_w, dot_a)
        qg = warpgroup_mma(a, b_sm, zero, is_async=True)
        qu = qg
        if GATED or PAIRED:  # the second weight (up, or the second row set) against the same x
            a_up = _wg_a_operand(w2_sm.index(slot).load(gl.SliceLayout(4, zero_w.type.layout)), zero_w, dot_a)
            qu = warpgroup_mma(a_up, b_sm, zero, is_async=True)
            if SELF_XS:  # (PAIRED only: the gated launch takes x's sums)
                qx = warpgroup_mma(ones, b_sm, zero, is_async=True)
                qg, qu, xsum, a, a_up = warpgroup_mma_wait(0, deps=[qg, qu, qx, a, a_up])
            elif SPLIT:  # the first weight's FMAs while the second's MMAs run (the same FMAs, in order)
                qg, a = warpgroup_mma_wait(1, deps=[qg, a])
                xsum = gl.broadcast(gl.expand_dims(xs, 0), zero)[0]
                a0, a1, a2, a3 = _wg_partial_fma(a0, a1, a2, a3, w, qg, bf16_pair(sbq.slice(0, 64).load(RL)), xsum)
                qu, a_up = warpgroup_mma_wait(0, deps=[qu, a_up])
            else:
                qg, qu, a, a_up = warpgroup_mma_wait(0, deps=[qg, qu, a, a_up])
                xsum = gl.broadcast(gl.expand_dims(xs, 0), zero)[0]
        elif SELF_XS:
            qx = warpgroup_mma(ones, b_sm, zero, is_async=True)
            qg, xsum, a = warpgroup_mma_wait(0, deps=[qg, qx, a])
        else:
            qg, a = warpgroup_mma_wait(0, deps=[qg, a])
            xsum = gl.broadcast(gl.expand_dims(xs, 0), zero)[0]
        if not SPLIT:  # (the split wait made the first weight's FMAs between its two waits)
            a0, a1, a2, a3 = _wg_partial_fma(a0, a1, a2, a3, w, qg, bf16_pair(sbq.slice(0, 64).load(RL)), xsum)
        if GATED or PAIRED:
            c0, c1, c2, c3 = _wg_partial_fma(c0, c1, c2, c3, w, qu, bf16_pair(sbq.slice(64, 64).load(RL)), xsum)
        return a0, a1, a2, a3, c0, c1, c2, c3

    @gluon.jit
    def _wg_issue(w_sm, w2_sm, xq_sm, sb_sm, slot, w_src, w2_src, x_src, sq_src, wmask, xq_mask, sq_mask,
                  GATED: gl.constexpr, GS: gl.constexpr = 1, DG: gl.constexpr = 1):
        """GS groups' copies (words of one or both weights, x's pairs, the (s, b) pairs), group i = the sources'
        group + i DG into slot `slot` of buffer i, as one cp.async group."""
        for i in gl.static_range(GS):
            async_copy.async_copy_global_to_shared(w_sm[i].index(slot), w_src + i * DG * 128, mask=wmask)
            if GATED:
                async_copy.async_copy_global_to_shared(w2_sm[i].index(slot), w2_src + i * DG * 128, mask=wmask)
            async_copy.async_copy_global_to_shared(xq_sm[i].index(slot), x_src + i * DG * 32, mask=xq_mask)
            async_copy.async_copy_global_to_shared(sb_sm[i].index(slot), sq_src + i * DG * 16, mask=sq_mask)
        async_copy.commit_group()

    @gluon.jit
    def _wg_program(xq_ptr, xs_ptr, w_ptr, w2_ptr, sbq_ptr, sb2q_ptr, out_ptr, scale_ptr, tile_e_ptr, lo_ptr, hi_ptr,
                    order_ptr, stride_xq, stride_sm, stride_om, NBE, M, XREP: gl.constexpr, K: gl.constexpr,
                    W: gl.constexpr, BN: gl.constexpr, GATED: gl.constexpr, SCALED: gl.constexpr,
                    SELF_XS: gl.constexpr, NS: gl.constexpr, PARTIAL_MAJOR: gl.constexpr, DENSE: gl.constexpr,
                    PDL_WAIT: gl.constexpr, cw_ptr=None, pool_ptr=None, slot_ptr=None, ctx_ptr=None, C=0, stride_cwc=0,
                    stride_cwk=0, stride_ps=0, stride_pc=0, stride_pk=0, CONV: gl.constexpr = False,
                    KCONV: gl.constexpr = 4, XS_SMEM: gl.constexpr = False, SLOT_CARRY: gl.constexpr = False,
                    GS: gl.constexpr = 1, PAIRED: gl.constexpr = False, FOLD_PAIR: gl.constexpr = False,
                    SPLIT_WAIT: gl.constexpr = False, KS: gl.constexpr = 1, part_ptr=None, cnt_ptr=None,
                    stride_part=0, TSTEP: gl.constexpr = 1, TILE0: gl.constexpr = 0):
        """grid (tiles, NBE / 4): tile t (sorted rows [lo, hi) of expert tile_e[t], at most BN; expert -1 reads and
        writes nothing) against row blocks 4 p .. 4 p + 3 of its expert (64 weight rows). Sorted row i is output
        row order[i] and input row order[i] // XREP. Epilogues as mma_experts._experts_store: GATED (w2 the up
        projection) out = bf16(bf16(SiLU(bf16 y)) * bf16 y2); SCALED out (fp32) = scale[row] * bf16(y); else y in
        out's dtype. W: the K split of the mma.sync kernel whose bits these are (groups w, w + W, ... summed apart,
        then added as its cross-warp reduction adds them: (a0 + a2) + (a1 + a3)).
        Each group's words, x (bf16 pairs through xq_ptr, x's int32 view, written in the fragment order) and (s, b)
        pairs go through NS shared-memory slots filled by cp.async, NS - 1 groups in flight; the group's MMAs (gate,
        up, and the group sums' when SELF_XS) are issued together and awaited once.
        DENSE: one weight (E = 1) and no table: tile t is rows [t BN, min(t BN + BN, M)) in order (wg_gemv); the
        plain epilogue rounds to bf16 before a wider out (the fp32 logits: the bf16 results widened).
        XS_SMEM (x's group sums given): the tile's sums of every group [G, BN] copied to shared memory once, with the
        first group's copies, and read from there each step, instead of BN / 4 global loads a thread a step, each
        with its 64-bit address (the same values, so the same bits). SLOT_CARRY: a step's shared-memory slot and the
        slot it refills carried from step to step instead of computed as step % NS and (step + NS - 1) % NS (two
        divisions by NS a step, ~18 uniform instructions at NS = 3; the same slots, so the same bits).
        GS: groups a step (1 or 2, dividing G // W): a slot holds GS groups, copied as one cp.async group, so the wait,
        fence, barriers and slot bookkeeping come once per GS groups (NS - 1 steps, (NS - 1) GS groups, in flight).
        Each group's MMAs and FMAs are as at GS = 1, in the same order, so the same bits.
        PAIRED (one weight, not GATED): a program owns two row sets of 64, row blocks 8 p .. 8 p + 3 through w_ptr /
        sbq_ptr and 8 p + 4 .. 8 p + 7 through w2_ptr / sb2q_ptr (the same stack seen from 4 row blocks on), both
        against the one copy of x in shared memory (grid (tiles, NBE / 8)): x read once per 128 weight rows; each
        row set's MMAs and FMAs as in a program of its own, so the same bits.
        FOLD_PAIR (PARTIAL_MAJOR, W = 4): the partial sums taken 0, 2, 1, 3 and 0 + 2 added once both are complete
        (_wg_sum's first add, made early), so three are held instead of four (wg_fold_pair). SPLIT_WAIT (GATED): gate's
        FMAs between a wait for gate's MMAs and one for up's (wg_split_wait). Neither changes a bit.
        KS (DENSE): the K split over KS programs (grid (tiles, NBE / 4, KS)): program j takes the groups j, j + KS,
        j + 2 KS, ... (the mma.sync kernel's partial sums w = j (mod KS), K's W = KS * W here), sums them as a
        program of W partial sums over those groups (_wg_sum: the butterfly's higher levels), stores that fp32 to
        part_ptr [KS, M, N] (split stride stride_part) and arrives at tile t, row set p's counter (cnt_ptr, zero
        outside a launch); the last of the KS adds the KS sums by the butterfly's lower levels (_wg_tree) and makes
        the epilogue. The same adds of the same values, so the same bits.
        TSTEP, TILE0 (the table's tiles): program i takes tile TILE0 + i TSTEP, so TSTEP launches with TILE0 = 0 ..
        TSTEP - 1 take every tile once between them (wg_matmul_experts(tile_set=)): each tile the same work, so the
        same bits. Both constexpr, so the joint launch (1, 0) has no argument more than before them."""
        GW: gl.constexpr = K // 64  # the weight's groups (its layout)
        G: gl.constexpr = GW // KS  # the groups this program adds
        FOLD: gl.constexpr = PARTIAL_MAJOR and W == 4 and FOLD_PAIR  # partial sums 0 and 2 first, then added
        TWO: gl.constexpr = GATED or PAIRED  # two weights' words and (s, b) a step
        RSET: gl.constexpr = 8 if PAIRED else 4  # row blocks of 16 a program
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
        dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        WL8: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4, 8], [1, 8, 4, 1, 1], [4, 1, 1, 1, 1], [4, 3, 2, 1, 0])
        WL: gl.constexpr = gl.SliceLayout(4, WL8)  # words [4 r, 8 rr, 4 c, 4 j]: one 16-byte copy a thread
        XPL: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])  # x's pairs [BN, 32]
        SQL: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [2, 2], [1, 0])  # (s, b) pairs [2 weights, 64 rows]
        RL: gl.constexpr = gl.SliceLayout(1, mma)  # per weight row
        CL: gl.constexpr = gl.SliceLayout(0, mma)  # per sorted row of x
        WSH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[3, 2, 1, 0])
        SSH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        SSH1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])  # the same bytes, read per weight
        XSH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        XSH32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)

        t = gl.program_id(0) * TSTEP + TILE0
        p = gl.program_id(1).to(gl.int64)
        pdl_wait(PDL_WAIT)  # the tile table and x are the previous launches' output (the kernel opened: pdl_open)
        if DENSE:
            e = 0
            lo = t * BN
            rows = gl.minimum(M - lo, BN)
        else:
            e = gl.load(tile_e_ptr + t)
            lo = gl.load(lo_ptr + t)
            rows = gl.where(e >= 0, gl.load(hi_ptr + t) - lo, 0)
        live = rows > 0
        blk = (gl.maximum(e, 0).to(gl.int64) * NBE + p * RSET) * GW  # row block RSET p of the expert, group 0

        # the words of row block RSET p + r, group g: (blk + r G) 128 + g 128 + lane 4 + j (int32)
        w_off = wg_words_offsets(WL, GW)
        w_base = w_ptr + blk * 128 + w_off
        w2_base = w2_ptr + blk * 128 + w_off
        wmask = (w_off >= 0) & live
        # x's bf16 pairs: pair kk // 2 = 8 j + 4 i2 + c of a group is its pair 8 c + 2 j + i2
        pn = gl.arange(0, BN, layout=gl.SliceLayout(1, XPL))
        pk = gl.arange(0, 32, layout=gl.SliceLayout(0, XPL))
        ptok = _wg_rows(order_ptr, lo, pn, rows, DENSE) // XREP
        pcol = (pk % 4) * 8 + (pk // 8) * 2 + (pk // 4) % 2
        x_base = xq_ptr + (ptok.to(gl.int64) * stride_xq)[:, None] + pcol[None, :]
        xq_mask = (pn < rows)[:, None] & (pk >= 0)[None, :]
        # (s, b) of weight k (0 gate, 1 up; one weight: twice), row m = 16 r + 8 i1 + rr, as int32:
        # (blk + r G) 16 + g 16 + 2 rr + i1
        qk = gl.arange(0, 2, layout=gl.SliceLayout(1, SQL))
        qm = gl.arange(0, 64, layout=gl.SliceLayout(0, SQL))
        q_off = blk * 16 + gl.zeros([2, 64], gl.int64, layout=SQL) + ((qm // 16) * (GW * 16) + (qm % 8) * 2
                                                                      + (qm // 8) % 2)[None, :]
        sq_base = gl.where((qk == 1)[:, None] & TWO, sb2q_ptr + q_off, sbq_ptr + q_off)
        sq_mask = live & (qk >= 0)[:, None] & (qm >= 0)[None, :]
        ks = 0
        if KS > 1:  # this program's first group, j; its groups KS apart (every group offset below times KS)
            gl.static_assert(DENSE, "the K split over programs is the dense GEMV's")
            ks = gl.program_id(2)
            w_base += ks * 128
            x_base += ks * 32
            sq_base += ks * 16
        cn = gl.arange(0, BN, layout=CL)
        s_tok = _wg_rows(order_ptr, lo, cn, rows, DENSE) // XREP
        xs_base = xs_ptr + s_tok.to(gl.int64) * stride_sm + ks
        xs_mask = cn < rows
        GP: gl.constexpr = _wg_pow2(G)  # the sums' groups padded to a power of two (the masked tail never read)
        TG: gl.constexpr = _wg_min(GP, 32)
        # the sums' copy [GP, BN]: a row's groups (contiguous in global) along the lanes
        XGL: gl.constexpr = gl.BlockedLayout([1, 1], [TG, 32 // TG], [1, 4], [0, 1])
        if XS_SMEM and not SELF_XS:
            xs_sm = gl.allocate_shared_memory(gl.float32, [GP, BN], SSH1)  # read a group's [BN] at a time

        # a step's group i in buffer i of each tuple (its own allocation: no hazard barrier between the copies)
        w_sm = _wg_buffers(gl.int32, [NS, 4, 8, 4, 4], WSH, GS)
        w2_sm = w_sm
        if TWO:
            w2_sm = _wg_buffers(gl.int32, [NS, 4, 8, 4, 4], WSH, GS)
        xq_sm = _wg_buffers(gl.int32, [NS, BN, 32], XSH32, GS)  # read as bf16 [BN, 64]: 128-byte rows
        sb_sm = _wg_buffers(gl.int32, [NS, 2, 64], SSH, GS)

        zero_w = gl.zeros([4, 8, 4, 4, 8], gl.int32, layout=WL8)
        zero = gl.zeros([64, BN], gl.float32, layout=mma)
        ones = gl.full([64, 64], 1.0, gl.bfloat16, layout=dot_a)
        a0 = zero
        a1 = zero
        a2 = zero
        a3 = zero
        c0 = zero
        c1 = zero
        c2 = zero
        c3 = zero
        if rows > 0:  # the table's unused tail tiles (expert -1, ~20% of them at 512 tokens) skip the work
            NCH: gl.constexpr = G // W
            if XS_SMEM and not SELF_XS:  # committed with the first group's copies, so complete before step 0
                gg = gl.arange(0, GP, layout=gl.SliceLayout(1, XGL))
                gn = gl.arange(0, BN, layout=gl.SliceLayout(0, XGL))
                g_tok = _wg_rows(order_ptr, lo, gn, rows, DENSE) // XREP
                g_src = xs_ptr + (g_tok.to(gl.int64) * stride_sm)[None, :] + (gg * KS + ks)[:, None]
                async_copy.async_copy_global_to_shared(xs_sm._reinterpret(gl.float32, [GP, BN], SSH), g_src,
                                                       mask=(gg < G)[:, None] & (gn < rows)[None, :])
            # a step's groups: GS consecutive steps of the group order below, group g and g + DG (DG = W partial sum
            # by partial sum, else 1; GS divides NCH, so a step's groups share a partial sum's run)
            DG: gl.constexpr = W if PARTIAL_MAJOR else 1
            S: gl.constexpr = G // GS  # steps
            for i in gl.static_range(NS - 1):  # steps 0 .. NS - 2 requested
                g0 = _wg_group(i * GS, W, NCH, PARTIAL_MAJOR, FOLD) * KS
                _wg_issue(w_sm, w2_sm, xq_sm, sb_sm, i, w_base + g0 * 128, w2_base + g0 * 128, x_base + g0 * 32,
                          sq_base + g0 * 16, wmask, xq_mask, sq_mask, TWO, GS, DG * KS)
            slot = 0
            if SLOT_CARRY:
                slot = t * 0  # step 0's slot (a runtime value, carried through the loops)
            xs_n = 0.0
            if not SELF_XS and not XS_SMEM:
                xs_n = gl.load(xs_base, mask=xs_mask, other=0.0)
            if PARTIAL_MAJOR:
                # partial sum w's groups w, w + W, ... in turn, the partial sums in _wg_rev's order (group step
                # i NCH + c is group c W + _wg_rev(i)): each partial sum adds its groups in the same order, so the
                # same bits, with one partial sum updated at a time; at W = 4 partial sums 0 and 2 come first and
                # are added once both are complete, as _wg_sum adds them (FOLD), so three are held, not four
                for pi in gl.static_range(W):
                    w = _wg_rev(pi, W if FOLD else 1)
                    for cs in range(NCH // GS):
                        st = pi * (NCH // GS) + cs  # the step; its groups are group steps st GS + i
                        ns1 = gl.minimum((st + NS - 1) * GS, G - GS)
                        _wg_advance(w_sm, w2_sm, xq_sm, sb_sm, _wg_refill(slot, st, NS, SLOT_CARRY),
                                    _wg_step_group(ns1, W, NCH, FOLD) * KS, st + NS - 1 < S, w_base, w2_base,
                                    x_base, sq_base, wmask, xq_mask, sq_mask, NS, TWO, GS, DG * KS)
                        for i in gl.static_range(GS):
                            c = cs * GS + i
                            step = pi * NCH + c
                            xs = xs_n
                            if XS_SMEM and not SELF_XS:
                                xs = xs_sm.index(c * W + w).load(CL)
                            elif not SELF_XS:
                                s1 = gl.minimum(step + 1, G - 1)
                                xs_n = gl.load(xs_base + _wg_step_group(s1, W, NCH, FOLD) * KS, mask=xs_mask,
                                               other=0.0)
                            a0, a1, a2, a3, c0, c1, c2, c3 = _wg_step(
                                a0, a1, a2, a3, c0, c1, c2, c3, w, _wg_cur(slot, st, NS, SLOT_CARRY), xs,
                                w_sm[i], w2_sm[i], xq_sm[i], sb_sm[i], zero_w, zero, ones, dot_a, RL, XSH, SSH1, BN,
                                GATED, SELF_XS, PAIRED, SPLIT_WAIT)
                        if SLOT_CARRY:
                            slot = gl.where(slot == NS - 1, 0, slot + 1)
                    if FOLD and pi == 1:  # partial sums 0 and 2 complete: _wg_sum's first add, done now
                        a0 = _wg_here(a0 + a2)
                        c0 = _wg_here(c0 + c2)
                        a2 = zero
                        c2 = zero
            else:
                # group g into partial sum g % W, in K order: WS steps an iteration (a chunk of W groups, or of GS)
                WS: gl.constexpr = _wg_max(W // GS, 1)
                for o in range(S // WS):
                    for ws in gl.static_range(WS):
                        st = o * WS + ws  # the step: groups st GS + i
                        _wg_advance(w_sm, w2_sm, xq_sm, sb_sm, _wg_refill(slot, st, NS, SLOT_CARRY),
                                    gl.minimum((st + NS - 1) * GS, G - GS) * KS, st + NS - 1 < S, w_base, w2_base,
                                    x_base, sq_base, wmask, xq_mask, sq_mask, NS, TWO, GS, DG * KS)
                        for i in gl.static_range(GS):
                            g = st * GS + i
                            w = (ws * GS + i) % W
                            xs = xs_n
                            if XS_SMEM and not SELF_XS:
                                xs = xs_sm.index(g).load(CL)
                            elif not SELF_XS:
                                xs_n = gl.load(xs_base + gl.minimum(g + 1, G - 1) * KS, mask=xs_mask, other=0.0)
                            a0, a1, a2, a3, c0, c1, c2, c3 = _wg_step(
                                a0, a1, a2, a3, c0, c1, c2, c3, w, _wg_cur(slot, st, NS, SLOT_CARRY), xs,
                                w_sm[i], w2_sm[i], xq_sm[i], sb_sm[i], zero_w, zero, ones, dot_a, RL, XSH, SSH1, BN,
                                GATED, SELF_XS, PAIRED, SPLIT_WAIT)
                        if SLOT_CARRY:
                            slot = gl.where(slot == NS - 1, 0, slot + 1)
            async_copy.wait_group(0)
            y = _wg_sum(a0, a1, a2, a3, W, FOLD)
            o_n = gl.arange(0, BN, layout=CL)
            o_row = gl.arange(0, 64, layout=RL)
            o_dst = _wg_rows(order_ptr, lo, o_n, rows, DENSE).to(gl.int64)
            o_mask = (o_n < rows)[None, :]
            o_ptr = out_ptr + o_dst[None, :] * stride_om + p * (16 * RSET) + o_row[:, None]
            last = True
            if KS > 1:  # this program's sum stored; the last of the KS adds them (the epilogue below is its alone)
                pt_ptr = part_ptr + o_dst[None, :] * (NBE * 16) + p * 64 + o_row[:, None]
                gl.store(pt_ptr + ks * stride_part, y, mask=o_mask)
                cnt = cnt_ptr + t * (NBE // 4) + p
                last = _arrival(cnt) == KS - 1
                if last:
                    gl.store(cnt, 0)
                    y = _wg_tree(y, ks, pt_ptr, stride_part, o_mask, KS)
            if last:
                if GATED:
                    y2 = _wg_sum(c0, c1, c2, c3, W, FOLD)
                    gl.store(o_ptr, _silu_mul(y.to(gl.bfloat16).to(gl.float32), y2.to(gl.bfloat16).to(gl.float32)),
                             mask=o_mask)
                elif SCALED:
                    sc = gl.load(scale_ptr + o_dst, mask=o_n < rows, other=0.0)
                    gl.store(o_ptr, sc[None, :] * y.to(gl.bfloat16).to(gl.float32), mask=o_mask)
                    if PAIRED:
                        y2 = _wg_sum(c0, c1, c2, c3, W, FOLD)
                        gl.store(o_ptr + 64, sc[None, :] * y2.to(gl.bfloat16).to(gl.float32), mask=o_mask)
                elif CONV:
                    # the DeltaNet decode conv on the tile (mma_gemv's epilogue: its arithmetic, so its bits): features
                    # 64 p + row, tokens lo + i (DENSE; those past M are masked inside); the accumulator layout holds
                    # each element once
                    gl.static_assert(DENSE, "the conv epilogue is the dense GEMV's")
                    _conv_epilogue(y, out_ptr, stride_om, p * 64 + o_row, lo + o_n, M, cw_ptr, pool_ptr, slot_ptr,
                                   ctx_ptr, C, stride_cwc, stride_cwk, stride_ps, stride_pc, stride_pk, KCONV)
                else:
                    gl.store(o_ptr, y.to(gl.bfloat16).to(o_ptr.dtype.element_ty), mask=o_mask)
                    if PAIRED:
                        y2 = _wg_sum(c0, c1, c2, c3, W, FOLD)
                        gl.store(o_ptr + 64, y2.to(gl.bfloat16).to(o_ptr.dtype.element_ty), mask=o_mask)

    @gluon.jit
    def _wg_gemv_kernel(xq_ptr, xs_ptr, w_ptr, sbq_ptr, out_ptr, stride_xq, stride_sm, stride_om, NBE, M,
                        cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C, stride_cwc, stride_cwk, stride_ps, stride_pc,
                        stride_pk, K: gl.constexpr, W: gl.constexpr, BN: gl.constexpr, SELF_XS: gl.constexpr,
                        NS: gl.constexpr = 3, PARTIAL_MAJOR: gl.constexpr = False, CONV: gl.constexpr = False,
                        KCONV: gl.constexpr = 4, PDL: gl.constexpr = False, XS_SMEM: gl.constexpr = False,
                        SLOT_CARRY: gl.constexpr = False, GS: gl.constexpr = 1, FOLD_PAIR: gl.constexpr = False,
                        KS: gl.constexpr = 1, part_ptr=None, cnt_ptr=None, stride_part=0):
        """The dense GEMV (wg_gemv): _wg_program with one weight and no table (DENSE); a kernel of its own name, so
        that profiles count it with the linears. CONV: mma_gemv's DeltaNet decode conv epilogue (the pool arguments
        unused otherwise). KS: K split over KS programs (part_ptr, cnt_ptr, stride_part: _wg_program's)."""
        pdl_open(PDL)
        _wg_program(xq_ptr, xs_ptr, w_ptr, w_ptr, sbq_ptr, sbq_ptr, out_ptr, out_ptr, xq_ptr, xq_ptr, xq_ptr, xq_ptr,
                    stride_xq, stride_sm, stride_om, NBE, M, 1, K, W, BN, False, False, SELF_XS, NS, PARTIAL_MAJOR,
                    True, PDL, cw_ptr, pool_ptr, slot_ptr, ctx_ptr, C, stride_cwc, stride_cwk, stride_ps, stride_pc,
                    stride_pk, CONV, KCONV, XS_SMEM, SLOT_CARRY, GS, FOLD_PAIR=FOLD_PAIR, KS=KS, part_ptr=part_ptr,
                    cnt_ptr=cnt_ptr, stride_part=stride_part)

    @gluon.jit
    def _wg_rows(order_ptr, lo, i, rows, DENSE: gl.constexpr):
        """The rows that a tile's sorted rows i (< rows) stand for: order[lo + i], or lo + i with no table (DENSE)."""
        if DENSE:
            return gl.where(i < rows, lo + i, 0)
        return gl.load(order_ptr + lo + i, mask=i < rows, other=0)

    @gluon.jit
    def _wg_cur(slot, step, NS: gl.constexpr, SLOT_CARRY: gl.constexpr):
        """A step's shared-memory slot: the carried one, or step % NS."""
        if SLOT_CARRY:
            return slot
        return step % NS

    @gluon.jit
    def _wg_refill(slot, step, NS: gl.constexpr, SLOT_CARRY: gl.constexpr):
        """The slot a step refills (the step before's): from the carried one, or (step + NS - 1) % NS."""
        if SLOT_CARRY:
            return gl.where(slot == 0, NS - 1, slot - 1)
        return (step + NS - 1) % NS

    @gluon.jit
    def _wg_buffers(dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr, GS: gl.constexpr):
        """GS shared-memory allocations of one shape, as a tuple (a step's group i in buffer i)."""
        if GS == 1:
            return (gl.allocate_shared_memory(dtype, shape, layout),)
        else:
            return (gl.allocate_shared_memory(dtype, shape, layout), gl.allocate_shared_memory(dtype, shape, layout))

    @gluon.constexpr_function
    def _wg_pow2(n):
        """The least power of two >= n."""
        return 1 << (n - 1).bit_length()

    @gluon.constexpr_function
    def _wg_min(a, b):
        return min(a, b)

    @gluon.constexpr_function
    def _wg_max(a, b):
        return max(a, b)

    @gluon.jit
    def _wg_here(v):
        """v (fp32) computed where this stands: a copy through an asm with side effects, which the compilers do not
        move, so the adds feeding it are not sunk to v's last use (LLVM sank the fold's adds past the loops that
        follow, holding four partial sums again; sm_90 SASS: the copies coalesce away)."""
        return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [v], dtype=gl.float32, is_pure=False, pack=1)

    @gluon.jit
    def _wg_sum(a0, a1, a2, a3, W: gl.constexpr, FOLD: gl.constexpr = False):
        """The W partial sums added as the mma.sync kernel's cross-warp reduction adds them (its sm_90 SASS: the
        butterfly over the warps' values at lane distance 2, then 1; the GPU probe: every element equal). FOLD:
        a0 holds a0 + a2 already (a2 unread; adding its zero could flip a -0.0)."""
        if W == 1:
            return a0
        elif W == 2:
            return a0 + a1
        elif FOLD:
            return a0 + (a1 + a3)
        else:
            return (a0 + a2) + (a1 + a3)

    @gluon.jit
    def _wg_part(own, ks, i: gl.constexpr, pt_ptr, stride_part, o_mask):
        """Split i's sum of the tile: this program's own (ks == i) from its registers, another's re-read from L2
        (.cg: never a stale line of this SM's L1), after the last arrival's acquire."""
        other = gl.load(pt_ptr + i * stride_part, mask=o_mask & (ks != i), other=0.0, cache_modifier=".cg")
        return gl.where(ks == i, own, other)

    @gluon.jit
    def _wg_tree(own, ks, pt_ptr, stride_part, o_mask, KS: gl.constexpr):
        """The KS splits' sums added by the butterfly's lower levels, as the mma.sync kernel's cross-warp reduction
        adds its warps' values at lane distances KS / 2, ..., 1 (its higher levels each split's _wg_sum made):
        KS 2: s0 + s1; 4: (s0 + s2) + (s1 + s3); 8: ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))."""
        s0 = _wg_part(own, ks, 0, pt_ptr, stride_part, o_mask)
        s1 = _wg_part(own, ks, 1, pt_ptr, stride_part, o_mask)
        if KS == 2:
            return s0 + s1
        s2 = _wg_part(own, ks, 2, pt_ptr, stride_part, o_mask)
        s3 = _wg_part(own, ks, 3, pt_ptr, stride_part, o_mask)
        if KS == 4:
            return (s0 + s2) + (s1 + s3)
        s4 = _wg_part(own, ks, 4, pt_ptr, stride_part, o_mask)
        s5 = _wg_part(own, ks, 5, pt_ptr, stride_part, o_mask)
        s6 = _wg_part(own, ks, 6, pt_ptr, stride_part, o_mask)
        s7 = _wg_part(own, ks, 7, pt_ptr, stride_part, o_mask)
        return ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))


def _order_args(warps: int, partial_major: bool | None, fold: bool | None) -> dict:
    """The launch arguments of the groups' order: PARTIAL_MAJOR (partial_major, None: wg_partial_major()) where K is
    split, and FOLD_PAIR (fold, None: wg_fold_pair()) where that split is 4 partial sums taken partial-major."""
    major = warps > 1 and (wg_partial_major() if partial_major is None else partial_major)
    folded = major and warps == 4 and (wg_fold_pair() if fold is None else fold)
    return {**({"PARTIAL_MAJOR": True} if major else {}), **({"FOLD_PAIR": True} if folded else {})}


def _step_args(self_xs: bool, xs_smem: bool | None, gs: int) -> dict:
    """The loop step's launch arguments where they apply: XS_SMEM (x's group sums given and staged: xs_smem, or
    wg_xs_smem() when None), SLOT_CARRY (wg_slot_carry()) and GS (gs groups a step, from wg_step_groups); an
    option off is left at the kernel's default."""
    args = {"XS_SMEM": True} if not self_xs and (wg_xs_smem() if xs_smem is None else xs_smem) else {}
    if gs > 1:
        args["GS"] = gs
    return {**args, "SLOT_CARRY": True} if wg_slot_carry() else args


def wg_dense_fits(words: torch.Tensor) -> bool:
    """Whether a repacked dense weight (words [N/16, K/64, 128]) suits wg_gemv: N a multiple of 64 (four row blocks
    a program); the mma_gemv K split whose bits it gives (4 warps from K = 1024, 8 from K = 4096) is at most 4
    partial sums a program with wg_gemv_ksplit's programs a row block (8 takes two or more)."""
    from .mma_gemv import default_warps

    if not (HAVE_GLUON and words.dim() == 3 and words.shape[0] % 4 == 0):
        return False
    warps = default_warps(words.shape[1] * GROUP)
    return wg_ksplit_fits(warps, wg_gemv_ksplit(warps))


def wg_ksplit_fits(warps: int, ks: int) -> bool:
    """Whether wg_gemv can split a K of `warps` mma.sync partial sums over ks programs: 1, 2, 4 or 8 dividing them,
    at most four a program."""
    return ks in (1, 2, 4, 8) and warps % ks == 0 and warps // ks <= 4


def wg_gemv_ksplit(warps: int, row_blocks: int = 0) -> int:
    """Programs over which wg_gemv splits a row block's K for a weight whose mma_gemv K split is `warps` (never a
    bit: program j adds the partial sums j, j + KS, ... as the mma.sync kernel's warps do, the last arrival adds
    the KS sums in its butterfly's order): 1, 2, 4 or 8, at most `warps`, and at least warps / 4 (a program holds
    up to four partial sums). launch_table "gemv_wgmma.ksplit" = (A, B): A for 4 warps (and fewer, capped at their
    count), B for 8 (the 2048 x 4096 out projections; 0: those stay on mma_gemv, wg_dense_fits).
    H200 (graph probe, lab/NOTES.md): the out projection at 64 / 32 rows on mma.sync 16.5 / 11.3 us, here over
    2 / 4 / 8 programs 18.6 / 14.9 / 13.8 and 13.8 / 9.9 / 7.8; the in_proj at 64 rows 24.3 (1), 21.8 (2), 24.7 (4),
    at 32 rows 15.9 / 16.9 / 17.5; in the model, 64 streams tg64 @ d512 6,126 / 6,118 (1,0) -> 6,173 (1,4), 6,180
    (1,8), 6,110 (2,4: the in_proj's split loses there).
    Weights of row_blocks >= "gemv_wgmma.ksplit_max_blocks" (4096; the lm_head: thousands of programs already, and
    a scratch of M x 248,320 fp32 a split) take the fewest programs their K split allows."""
    four, eight = launch_value("gemv_wgmma.ksplit")
    if row_blocks >= launch_value("gemv_wgmma.ksplit_max_blocks"):
        return max(warps // 4, 1)
    return min(eight if warps >= 8 else four, warps)


def wg_gemv(x: torch.Tensor, words: torch.Tensor, sb: torch.Tensor, xs: torch.Tensor | None = None,
            out: torch.Tensor | None = None, tile_rows: int | None = None, stages: int | None = None,
            partial_major: bool | None = None, conv: tuple | None = None,
            xs_smem: bool | None = None, fold: bool | None = None, ksplit: int | None = None) -> torch.Tensor:
    """mma_gemv.mma_gemv's result (the same bits: its K split W = default_warps(K), its group sums xs or, when None,
    the kernel's own MMA(ones, x)) for x [M, K] bf16 and a repack_q4 weight, through warpgroup MMAs: a program owns 64
    weight rows against tile_rows (8 - 64) rows of x, so x is read once per 64 weight rows instead of once per 16 or
    32 (mma_gemv at 64 rows: every program re-reads all of x from L2); None: launch_table "gemv_wgmma.tile_rows".
    stages: shared-memory slots of one group (None: "gemv_wgmma.stages"; never a bit). out: bf16, or fp32 (the bf16
    results widened), [M, N]. Any M (x's rows are MMA columns: a row's bits never depend on M or its neighbours).
    conv: mma_gemv's conv= (a DecodeConv or the same tuple; bf16 out): the DeltaNet decode conv in the epilogue,
    mma_gemv's arithmetic, meant to equal this GEMV followed by causal_conv bit for bit. xs_smem: xs staged in
    shared memory (None: wg_xs_smem(); never a bit); fold: as moe/wgmma_experts.wg_matmul_experts' (never a bit).
    ksplit: programs a row block's K is split over (None: wg_gemv_ksplit(); never a bit), their sums added at the
    last arrival through an fp32 scratch [ksplit, M, N]."""
    from ..triton_sync import arrival_counters
    from .mma_gemv import decode_conv_args, default_warps

    if not HAVE_GLUON or backend.interpreting() or x.device.type != "cuda":
        raise RuntimeError("wg_gemv: needs a CUDA device (sm_90) and Triton's Gluon")
    if not wg_dense_fits(words):
        raise ValueError(f"wg_gemv: a repacked weight [N/16, K/64, 128] with N % 64 == 0 and K <= 4096, found "
                         f"{tuple(words.shape)}")
    nb, g = words.shape[:2]
    n, k = nb * 16, g * GROUP
    if x.dim() != 2 or x.shape[1] != k or x.stride(-1) != 1 or x.stride(0) % 2 or x.dtype != torch.bfloat16:
        raise ValueError(f"wg_gemv: x must be bf16 [rows, {k}] with unit column stride and an even row stride, "
                         f"found {x.dtype} {tuple(x.shape)} strides {x.stride()}")
    tile_rows = launch_value("gemv_wgmma.tile_rows") if tile_rows is None else tile_rows
    stages = launch_value("gemv_wgmma.stages") if stages is None else stages
    if tile_rows not in (8, 16, 32, 64):
        raise ValueError(f"wg_gemv: tiles of 8 - 64 rows of x, found {tile_rows}")
    m = x.shape[0]
    if xs is not None and (xs.dtype != torch.float32 or tuple(xs.shape) != (m, g) or xs.stride(-1) != 1):
        raise ValueError(f"wg_gemv: xs must be fp32 [{m}, {g}] with unit column stride, found {xs.dtype} "
                         f"{tuple(xs.shape)} strides {xs.stride()}")
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    elif out.dtype not in (torch.bfloat16, torch.float32) or tuple(out.shape) != (m, n) or out.stride(-1) != 1:
        raise ValueError(f"wg_gemv: out must be bf16 or fp32 [{m}, {n}] with unit column stride, found {out.dtype} "
                         f"{tuple(out.shape)} strides {out.stride()}")
    warps = default_warps(k)
    ks = wg_gemv_ksplit(warps, nb) if ksplit is None else ksplit
    if not wg_ksplit_fits(warps, ks):  # (wg_dense_fits refused an env split of 0)
        raise ValueError(f"wg_gemv: K = {k} is split over {warps} warps' partial sums, 1 - 4 a program: ksplit "
                         f"must divide {warps} and be at least {max(warps // 4, 1)}, found {ksplit}")
    warps, g_split = warps // ks, g // ks  # a program's partial sums and groups
    gs = wg_step_groups(tile_rows, g_split, warps, dense=True)
    stages = _wg_slots(stages, g_split, gs)
    if conv is not None and out.dtype != torch.bfloat16:
        raise ValueError(f"wg_gemv: conv= writes bf16 activations, out is {out.dtype}")
    kconv, conv_args = decode_conv_args(conv, m, n, x.dtype, x)
    if m:
        xq = x.view(torch.int32)
        self_xs = xs is None
        tiles = -(-m // tile_rows)
        split = {}
        if ks > 1:  # the splits' sums and, per (tile, row set), the arrival counter (zero outside a launch)
            split = {"KS": ks, "part_ptr": torch.empty(ks, m, n, dtype=torch.float32, device=x.device),
                     "cnt_ptr": arrival_counters(x.device, tiles * (nb // 4)), "stride_part": m * n}
        _wg_gemv_kernel[(tiles, nb // 4, ks)](
            xq, xq if self_xs else xs, words, sb.view(torch.int32), out, xq.stride(0), 0 if self_xs else xs.stride(0),
            out.stride(0), nb, m, *conv_args, K=k, W=warps, BN=tile_rows, SELF_XS=self_xs, NS=stages,
            CONV=conv is not None, KCONV=kconv, num_warps=4, **_step_args(self_xs, xs_smem, gs),
            **_order_args(warps, partial_major, fold), **wg_maxnreg(tile_rows, dense=True), **pdl_args(x), **split)
    return out

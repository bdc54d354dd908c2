"""The experts matmul of an MoE block on tensor cores (mma.sync): row m = x[m // x_repeat] W[expert_ids[m]]^T for
stacked q4 g64 experts repacked per expert (repack_q4_experts: quant/mma_gemv's repack_q4 of each, so no row block of
16 spans two experts), each row an MMA column of its expert's tile: the MoE's gate/up (GATED: h = SiLU(gate) * up),
its down (SCALED: a routed slot's contribution, optionally combined over the slots at the last-arriving program) and
the split forms (GLU: h made from g | u at load; PAIR: h beside g | u).

Tiles (MmaTiles, mma_expert_tiles): single rows at decode sizes (tile t is row t alone and the ids are the table), or
triton_affine.expert_tiles' table of up to 8 (16, 32, 64) sorted rows of one expert, so an expert picked by several
rows is read once per tile; a program owns RB row blocks of 16 of its expert's weight against its tile's rows.

The arithmetic is the dense tensor-core GEMV's (quant/mma_gemv.py, whose docstring gives the repacked layout and the
per-group factorisation): its fragment layouts, dequant, chunk loads and accumulation (_chunk_acc, _load_chunk,
_accumulate, the register ring, x staged in shared memory) imported from there, so a row's bits depend on (K, W) only,
as a GEMV row's do, never on which rows share the expert, the tile or the launch. A @gluon.jit function's callees are
resolved as globals of its own module, so those helpers are imported by name below.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import backend
from ..launch_table import value as launch_value
from ..quant.mma_gemv import (GROUP, HAVE_GLUON, ROW_BLOCK, STAGE_BYTES, column_tiles, default_warps,
                              mma_gemv_reference, repack_q4)
from ..triton_pdl import pdl_args

PAIR_COUNTERS = 1 << 16  # (tile, row-block pair) counters of the split gate/up's h at the second arrival (256 KB)

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy

    from ..quant.mma_gemv import (_accumulate, _accumulate_ring, _accumulate_slices, _arrival, _chunk_acc,
                                  _load_chunk, _load_slices, _load_weight_chunk, _mma_layout, _offsets, _sb_layout,
                                  _silu_mul, _stage_x, _staged_chunk, _words_layout, _x_layout, pdl_open, pdl_wait)

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


# The experts matmuls' tiles and operand checks, which this module's matmul and moe/wgmma_experts.py share.
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


def experts_operands(x: torch.Tensor, words: torch.Tensor, sb: torch.Tensor, up: tuple | None,
                     scale: torch.Tensor | None, xs: torch.Tensor | None, m: int, out: torch.Tensor | None,
                     who: str) -> torch.Tensor:
    """The checks both experts matmuls (mma_experts.mma_matmul_experts, wgmma_experts.wg_matmul_experts) make of
    their operands, for m rows against the stacked repacked weight (words, sb) [E, N / 16, G, ...]: the up weight of
    the gate's shape, one fp32 scale per row, x's group sums xs fp32 [rows of x, G] (None: the kernel's own); returns
    the output [m, N] (fp32 when scaled, else x's dtype), checked or allocated."""
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


def default_tile_rows(m: int, num_experts: int) -> int:
    """Rows per tile for m rows over num_experts: single rows while the mean rows per expert stays under one half
    (the table's three launches would cost more than the re-read weights they save), else launch_table
    "moe_mma.tile_rows" (8, one MMA column tile: on the H200 wider tiles were slower at every token count, up to
    2.3x at 16 rows per expert; the numbers in the table's doc, lab/NOTES.md: the kernel is bound by its programs'
    latency, not the dequant a wider tile shares). Never a row's bits."""
    if 2 * m <= num_experts:
        return 1
    return launch_value("moe_mma.tile_rows")


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
    from ..quant.triton_affine import expert_tiles

    return MmaTiles(*expert_tiles(ids, num_experts, rows), rows)


def default_row_blocks(nbe: int, m: int, k: int) -> int:
    """Row blocks of 16 per experts-kernel program (they share the program's x loads; never a row's bits): two for
    the short-K down projection past 16 rows, else one (H200: at K = 2048 more blocks were slower at every token
    count, at K = 512 two gave 50.9 vs 56.7 us at 64 tokens and 118 vs 141 at 512, one 3.6 vs 3.9 at 1)."""
    return 2 if k < 1024 and m > 16 and nbe % 2 == 0 else 1


def default_ahead(m: int, gated: bool, chunks: int = 8) -> int:
    """Chunks in flight per warp in the experts kernel (never a row's bits) for m rows and `chunks` chunks per warp.
    Up to 16 rows (one token's picks): the register ring, launch_table "moe_mma.ahead_gated_ring" (4) for the gated
    gate/up and chunks - 1 (the whole slice up front) for down. Past 16 rows: "moe_mma.ahead_batched" (2) for the
    gated form and down. What each won against (H200, 35B-A3B q4, lab/NOTES.md): the table's docs."""
    if m <= 16:
        gated_ahead = launch_value("moe_mma.ahead_gated_ring")
        return max(1, min(gated_ahead if gated else chunks - 1, chunks - 1)) if chunks > 1 else 1
    return launch_value("moe_mma.ahead_batched")


WSTAGE_BYTES = 160 << 10  # x staged whole plus the weight words' slots (the WSTAGE form): at most this per program


def default_wstage(m: int, gated: bool) -> int:
    """The weight words' shared-memory slots of the experts kernel (0: the words in registers, the AHEAD forms;
    never a row's bits). ncu at a 512-token prefill found down's stalls 61% on its weight words, and more chunks in
    registers were slower (AHEAD 2 -> 3 .. 8: 111.9 -> 118.5 .. 141.2 us). H200, 35B-A3B q4 (lab/NOTES.md, the
    sweep at 64 / 512 / 4096 tokens, 576+ rows): down with 3 slots 56.9 -> 51.8 / 133.0 -> 125.1 / 853.8 -> 853.2
    us (2: 53.4 / 125.1 / 852.9; 5 and 9 slower), the gated form slower with any (260 -> 335-373 us at 512), pp512
    B=1 18,346 -> 18,499, B=8 24,556 -> 24,772, then 17,831 -> 18,391; but 64-stream decode (576 rows) 2,451 ->
    2,303 tok/s: down takes launch_table "moe_mma.wstage_down" slots from "moe_mma.wstage_min_rows" rows (prefill
    sizes), the gated form none."""
    if m <= 16 or gated or m < launch_value("moe_mma.wstage_min_rows"):
        return 0
    return launch_value("moe_mma.wstage_down")


def pair_counters_fit(tiles: MmaTiles, nbe: int) -> bool:
    """Whether a pair_out launch over stacked [gate; up] weights of nbe row blocks per expert has a (tile, row-block
    pair) counter for each of `tiles`' tiles within the PAIR_COUNTERS allocated."""
    return tiles.tile_e.numel() * (nbe // 2) <= PAIR_COUNTERS


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

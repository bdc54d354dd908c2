"""MoE block for a few tokens (decode): router + top-k, gate/up over the picked experts, down + fixed-order combine.

Same meaning as the model's SparseMoeBlock on the reference path (`kernels/moe/routing.py::route_topk` +
`kernels/moe/reference.py::moe_combine_reference` with the shared expert), plus the optional residual add:

  logits = x W_router^T (fp32; W dense or affine, dequantised in fp32)      routing contract: top-k by logit, ties
  w_i = exp(l_i - l_top) / sum_k (normalize) or softmax_all(l)_i             to the lower id
  h_s = bf16(bf16(SiLU(bf16(x Wg_s^T))) * bf16(x Wu_s^T))                   for each picked expert s, shared last
  out = bf16( sum_{s in ascending id} w_s * bf16(h_s Wd_s^T) + sigmoid(x . w_sg) * bf16(h_sh Wd_sh^T) )
  out = bf16(residual + out)                                                  when a residual is given

Three launches: router logits (one program per (token, block of experts)), gate/up (one program per (token,
slot) and block of I; each first applies the top-k contract to its token's logits, cheap, to find its expert),
down + combine (one program per (token, block of H), looping over the slots in the fixed order). Every GEMV here reduces
in one fixed order per row (a [BN, BK] fp32 partial per program, summed once), so a token's output never depends on
the other tokens of the launch. Meant for T <= ~16 tokens; larger batches belong to the grouped expert matmul
(`kernels/quant/triton_affine.py::affine_matmul_experts`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ...utils import tuning
from ..launch_table import value as launch_value
from ..quant.triton_gemv import MAGIC, gemv_row_chunks, gemv_row_from, launch_gemv, pairwise_sums
from ..quant.triton_gemv_inline import inline_mode
from .gluon_router_rows import router_rows_logits, rows_fit
from .triton_router_mma import router_mma_fits, router_mma_logits
from .triton_router_common import _router_cg, _router_column, _router_shared_gate, _topk
from ..triton_common import WeightSpec, dequant_tile, residual_sum, rms_scaled
from ..triton_sync import arrival_counters, last_arrival
from ..triton_norm import rms_inverse
from ..triton_pdl import pdl_args, pdl_open, pdl_wait


@triton.jit
def gemv(x_row, w_ptr, s_ptr, b_ptr, rn, n_mask, stride_wn, stride_sn, K: tl.constexpr,
         BN: tl.constexpr, BK: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, ROUND_W: tl.constexpr):
    """W[rn, :K] . x as fp32 [BN]. The K loop is unrolled (K is a compile-time constant), so the loads of every
    chunk are independent and all in flight at once (a decode GEMV is latency-bound otherwise); each chunk is
    reduced with tl.sum and added in chunk order: a fixed order for a given (BN, BK). ROUND_W rounds the
    dequantised weight to bf16 first, as the reference does."""
    acc = tl.zeros((BN,), dtype=tl.float32)
    rk = tl.arange(0, BK)
    for c in tl.static_range(K // BK):
        w = dequant_tile(w_ptr, s_ptr, b_ptr, rn, n_mask, c * BK, stride_wn, stride_sn, BN, BK, BITS, GROUP)
        if ROUND_W:
            w = w.to(tl.bfloat16).to(tl.float32)
        xv = tl.load(x_row + c * BK + rk).to(tl.float32)
        acc += tl.sum(w * xv[None, :], axis=1)
    return acc


@triton.jit
def _router_kernel(
    x_ptr, rw_ptr, rs_ptr, rb_ptr, gw_ptr, gs_ptr, gb_ptr, logit_ptr, sg_ptr, ids_ptr, wts_ptr, cnt_ptr,
    E, stride_xt, stride_rn, stride_rsn, stride_gn, stride_gsn, magic,
    res_ptr, nw_ptr, y_ptr, ro_ptr, xs_ptr, scr_ptr, stride_res, norm_n, eps, offset,
    H: tl.constexpr, BE: tl.constexpr,
    R_BITS: tl.constexpr, R_GROUP: tl.constexpr, R_CG: tl.constexpr,
    HAS_SHARED: tl.constexpr, G_BITS: tl.constexpr, G_GROUP: tl.constexpr, G_CG: tl.constexpr,
    INLINE: tl.constexpr, TOPK: tl.constexpr = 0, EP: tl.constexpr = 1, NORMALIZE: tl.constexpr = True,
    PDL: tl.constexpr = False, SHARED_ONLY: tl.constexpr = False,
    NORM: tl.constexpr = 0, XS_GROUP: tl.constexpr = 64,
):
    # grid (T, cdiv(E, BE) + 1): column j < cdiv(E, BE) writes the fp32 logits of experts j*BE .. j*BE+BE-1 of
    # one token, the last column the shared gate's sigmoid (0 without a shared expert: every element of sg is
    # written, no zeros fill launch). Each row is one gemv_row (the full K unrolled, two chunks ahead): a
    # token's logits depend on (H, format, BE, CG) only, never on T. TOPK > 0: the token's last program to
    # finish (triton_sync.last_arrival on cnt[t]) applies the routing contract to all E logits and writes
    # ids/weights, so the top-k needs no launch of its own. PDL (triton_pdl): every branch waits for the kernel
    # that wrote x once its first weight chunks are requested (gemv_row's PDL_WAIT), before any store.
    pdl_open(PDL)
    t = tl.program_id(0)
    if NORM > 0:  # x is the mixer's output: each program makes the token's add_rms_norm itself (_router_normed;
        # 1: its dot product reads a scratch row of y, 2: makes y again at its x loads)
        _router_normed(x_ptr, rw_ptr, rs_ptr, rb_ptr, gw_ptr, gs_ptr, gb_ptr, logit_ptr, sg_ptr, E, stride_xt,
                       stride_rn, stride_rsn, stride_gn, stride_gsn, magic, res_ptr, nw_ptr, y_ptr, ro_ptr, xs_ptr,
                       scr_ptr, stride_res, norm_n, eps, offset, H, BE, R_BITS, R_GROUP, R_CG, HAS_SHARED, G_BITS,
                       G_GROUP, G_CG, INLINE, XS_GROUP, PDL, NORM == 2)
    elif SHARED_ONLY:  # grid (T, 1): the shared gate's column alone (the logits come from the rows launch)
        _router_shared_gate(x_ptr + t.to(tl.int64) * stride_xt, gw_ptr, gs_ptr, gb_ptr, sg_ptr, t, stride_gn,
                            stride_gsn, magic, H, BE, HAS_SHARED, G_BITS, G_GROUP, G_CG, INLINE, PDL)
    else:
        _router_column(x_ptr, rw_ptr, rs_ptr, rb_ptr, gw_ptr, gs_ptr, gb_ptr, logit_ptr, sg_ptr, E, stride_xt,
                       stride_rn, stride_rsn, stride_gn, stride_gsn, magic, H, BE, R_BITS, R_GROUP, R_CG, HAS_SHARED,
                       G_BITS, G_GROUP, G_CG, INLINE, PDL)
    if TOPK > 0:
        if last_arrival(cnt_ptr + t, tl.num_programs(1)):
            sel, wts, rank = _topk(logit_ptr + t * E, E, EP, TOPK, NORMALIZE, True)
            ex = tl.arange(0, EP)
            tl.store(ids_ptr + t * TOPK + rank, ex, mask=sel)
            tl.store(wts_ptr + t * TOPK + rank, wts, mask=sel)


@triton.jit
def _router_normed(x_ptr, rw_ptr, rs_ptr, rb_ptr, gw_ptr, gs_ptr, gb_ptr, logit_ptr, sg_ptr, E, stride_xt, stride_rn,
                   stride_rsn, stride_gn, stride_gsn, magic, res_ptr, nw_ptr, y_ptr, ro_ptr, xs_ptr, scr_ptr,
                   stride_res, norm_n, eps, offset, H: tl.constexpr, BE: tl.constexpr, R_BITS: tl.constexpr,
                   R_GROUP: tl.constexpr, R_CG: tl.constexpr, HAS_SHARED: tl.constexpr, G_BITS: tl.constexpr,
                   G_GROUP: tl.constexpr, G_CG: tl.constexpr, INLINE: tl.constexpr, XS_GROUP: tl.constexpr,
                   PDL_WAIT: tl.constexpr, TILES: tl.constexpr):
    """_router_column for a router launch that makes its input itself: program (t, j) computes its column (the
    logits of experts j*BE .. j*BE+BE-1, or the shared gate's sigmoid) by _normed_dot from token t's add_rms_norm."""
    t = tl.program_id(0)
    j = tl.program_id(1)
    rows = j * BE + tl.arange(0, BE)
    if j * BE < E:
        e_mask = rows < E
        logits = _normed_dot(x_ptr, rw_ptr, rs_ptr, rb_ptr, rows, e_mask, stride_rn, stride_rsn, magic, res_ptr, nw_ptr,
                             y_ptr, ro_ptr, xs_ptr, scr_ptr, t, j, stride_xt, stride_res, norm_n, eps, offset, H, BE,
                             R_BITS, R_GROUP, R_CG, INLINE, XS_GROUP, PDL_WAIT, TILES)
        tl.store(logit_ptr + t * E + rows, logits, mask=e_mask)
    else:
        one = tl.arange(0, BE)
        if HAS_SHARED:
            sg = _normed_dot(x_ptr, gw_ptr, gs_ptr, gb_ptr, one, one < 1, stride_gn, stride_gsn, magic, res_ptr, nw_ptr,
                             y_ptr, ro_ptr, xs_ptr, scr_ptr, t, j, stride_xt, stride_res, norm_n, eps, offset, H, BE,
                             G_BITS, G_GROUP, G_CG, INLINE, XS_GROUP, PDL_WAIT, TILES)
            tl.store(sg_ptr + t + one, tl.sigmoid(sg), mask=one < 1)
        else:
            pdl_wait(PDL_WAIT)
            tl.store(sg_ptr + t + one, tl.zeros((BE,), dtype=tl.float32), mask=one < 1)


@triton.jit
def _normed_dot(x_ptr, w_ptr, s_ptr, b_ptr, rows, mask, stride_wn, stride_sn, magic, res_ptr, nw_ptr, y_ptr, ro_ptr,
                xs_ptr, scr_ptr, t, j, stride_xt, stride_res, norm_n, eps, offset, H: tl.constexpr, BE: tl.constexpr,
                BITS: tl.constexpr, GROUP: tl.constexpr, CG: tl.constexpr, INLINE: tl.constexpr,
                XS_GROUP: tl.constexpr, PDL_WAIT: tl.constexpr, TILES: tl.constexpr):
    """W[rows] . y as fp32 [BE] for y = token t's add_rms_norm: the weight rows' first chunks requested, the wait
    (PDL_WAIT: the kernel's PDL wait), the norm made (_router_norm_row: the norm kernel's arithmetic, so the same
    bits), then the dot product reading y from a scratch row this program stored or, TILES and a packed weight,
    making y's values again at its x loads from the norm's inputs (no round trip)."""
    from_tiles: tl.constexpr = TILES and BITS != 16
    chunks = gemv_row_chunks(w_ptr, s_ptr, b_ptr, rows, mask, stride_wn, stride_sn, H, BITS, GROUP, BE, CG)
    pdl_wait(PDL_WAIT)
    y_row, inv = _router_norm_row(x_ptr, res_ptr, nw_ptr, y_ptr, ro_ptr, xs_ptr, scr_ptr, t, j, stride_xt, stride_res,
                                  norm_n, eps, offset, H, XS_GROUP, from_tiles)
    return gemv_row_from(chunks, y_row, w_ptr, s_ptr, b_ptr, rows, mask, stride_wn, stride_sn, magic, H, BITS, GROUP,
                         BE, CG, INLINE, res_ptr + t.to(tl.int64) * stride_res, nw_ptr, inv, offset, from_tiles)


@triton.jit
def _router_norm_row(x_ptr, res_ptr, nw_ptr, y_ptr, ro_ptr, xs_ptr, scr_ptr, t, j, stride_xt, stride_res, norm_n, eps,
                     offset, H: tl.constexpr, XS_GROUP: tl.constexpr, TILES: tl.constexpr):
    """Token t's add_rms_norm as triton_norm's kernel makes it (r = bf16(x + res), y = bf16(r * rms_inverse(r) *
    (offset + w)): the same helper, the same bits) in router program (t, j), which writes y to its own scratch row
    (scr [T, programs, H]) and returns that row's pointer after a barrier, for its dot product to read raw, and
    the row's 1 / rms; TILES: no scratch row, x's own row and 1 / rms returned (gemv_row_from NORMED). Program
    (t, 0) also writes the norm's outputs: y [T, H], r [T, H] (the block's residual) and y's group sums [T, H /
    XS_GROUP] (pairwise_sums, as the sums-only norm makes them)."""
    cols = tl.arange(0, H)
    t64 = t.to(tl.int64)
    act: tl.constexpr = y_ptr.dtype.element_ty
    r = residual_sum(tl.load(x_ptr + t64 * stride_xt + cols), tl.load(res_ptr + t64 * stride_res + cols), act)
    rf = r.to(tl.float32)
    inv = rms_inverse(rf, norm_n, eps, H)
    y = rms_scaled(rf, inv, offset, tl.load(nw_ptr + cols).to(tl.float32), act)
    if j == 0:
        tl.store(y_ptr + t64 * H + cols, y)
        tl.store(ro_ptr + t64 * H + cols, r)
        G: tl.constexpr = H // XS_GROUP
        tl.store(xs_ptr + t64 * G + tl.arange(0, G),
                 pairwise_sums(tl.reshape(y.to(tl.float32), [G, XS_GROUP]), G, XS_GROUP))
    if TILES:
        return x_ptr + t64 * stride_xt, inv
    else:
        y_row = scr_ptr + (t64 * tl.num_programs(1) + j) * H
        tl.store(y_row + cols, y)
        tl.debug_barrier()  # every thread's part of the row stored before any thread reads it
        return y_row, inv


@triton.jit
def slot_expert(logit_ptr, ids_ptr, wts_ptr, t, slot, E, EP: tl.constexpr, TOPK: tl.constexpr,
                NORMALIZE: tl.constexpr):
    """Expert id (int64) of routed slot `slot` of token t: the routing contract applied here to the token's E fp32
    logits (_topk: ties to the lower id, slots in ascending id, weights normalised, the same bits as every other
    top-k launch), every program of the token computing the same answer from the same values; the programs of
    column block 0 publish ids/weights for the down kernel and the caller."""
    sel, wts, rank = _topk(logit_ptr + t * E, E, EP, TOPK, NORMALIZE)
    rows = tl.arange(0, EP)
    mine = sel & (rank == slot)
    e = tl.sum(tl.where(mine, rows, 0), axis=0)
    if tl.program_id(1) == 0:
        tl.store(ids_ptr + t * TOPK + slot, e.to(tl.int32))
        tl.store(wts_ptr + t * TOPK + slot, tl.sum(tl.where(mine, wts, 0.0), axis=0))
    return e.to(tl.int64)


@triton.jit
def _silu_mul_bf16(g, u):
    """bf16(bf16(SiLU(bf16 g)) * bf16 u), the rounding points of the reference's bf16 SwiGLU."""
    gb = g.to(tl.bfloat16).to(tl.float32)
    ub = u.to(tl.bfloat16).to(tl.float32)
    act = (gb / (1.0 + tl.exp(-gb))).to(tl.bfloat16).to(tl.float32)
    return (act * ub).to(tl.bfloat16)


@triton.jit
def _gate_up_kernel(
    x_ptr, logit_ptr, ids_ptr, wts_ptr, h_ptr,
    gw, gs, gb, uw, us, ub, sgw, sgs, sgb, suw, sus, sub,
    E, I, IS, stride_xt, stride_ht, stride_hs,
    stride_ge, stride_gn, stride_gse, stride_gsn, stride_ue, stride_un, stride_use, stride_usn,
    stride_sgn, stride_sgsn, stride_sun, stride_susn,
    H: tl.constexpr, EP: tl.constexpr, TOPK: tl.constexpr, NORMALIZE: tl.constexpr, SLOTS: tl.constexpr,
    BN: tl.constexpr, BK: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, S_BITS: tl.constexpr,
    S_GROUP: tl.constexpr, S_BK: tl.constexpr,
):
    # grid (T * SLOTS, cdiv(max(I, IS), BN)); slot < TOPK: the slot-th picked expert (ascending id) of token t,
    # chosen here from the router logits (cheap: EP values); slot == TOPK: the shared expert
    pid = tl.program_id(0)
    t = pid // SLOTS
    slot = pid % SLOTS
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    x_row = x_ptr + t.to(tl.int64) * stride_xt
    h_row = h_ptr + t.to(tl.int64) * stride_ht + slot * stride_hs
    if slot < TOPK:
        e = slot_expert(logit_ptr, ids_ptr, wts_ptr, t, slot, E, EP, TOPK, NORMALIZE)  # publishes routing
        n_mask = rn < I
        g = gemv(x_row, gw + e * stride_ge, gs + e * stride_gse, gb + e * stride_gse, rn, n_mask, stride_gn,
                 stride_gsn, H, BN, BK, BITS, GROUP, True)
        u = gemv(x_row, uw + e * stride_ue, us + e * stride_use, ub + e * stride_use, rn, n_mask, stride_un,
                 stride_usn, H, BN, BK, BITS, GROUP, True)
        tl.store(h_row + rn, _silu_mul_bf16(g, u), mask=n_mask)
    else:
        n_mask = rn < IS
        g = gemv(x_row, sgw, sgs, sgb, rn, n_mask, stride_sgn, stride_sgsn, H, BN, S_BK, S_BITS, S_GROUP, True)
        u = gemv(x_row, suw, sus, sub, rn, n_mask, stride_sun, stride_susn, H, BN, S_BK, S_BITS, S_GROUP, True)
        tl.store(h_row + rn, _silu_mul_bf16(g, u), mask=n_mask)


@triton.jit
def _down_combine_kernel(
    h_ptr, ids_ptr, wts_ptr, sw_ptr, res_ptr, out_ptr,
    dw, ds, db, sdw, sds, sdb,
    H, stride_ht, stride_hs, stride_de, stride_dn, stride_dse, stride_dsn, stride_sdn, stride_sdsn,
    stride_rt, stride_ot, I: tl.constexpr, IS: tl.constexpr,
    TOPK: tl.constexpr, HAS_SHARED: tl.constexpr, HAS_RES: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    BKS: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, S_BITS: tl.constexpr, S_GROUP: tl.constexpr,
):
    # grid (T, cdiv(H, BN)); slots in ascending expert id (as the gate/up kernel published them), shared last
    t = tl.program_id(0)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = rn < H
    h_row = h_ptr + t.to(tl.int64) * stride_ht
    acc = tl.zeros((BN,), dtype=tl.float32)
    for s in tl.static_range(TOPK):
        e = tl.load(ids_ptr + t * TOPK + s).to(tl.int64)
        w_s = tl.load(wts_ptr + t * TOPK + s)
        y = gemv(h_row + s * stride_hs, dw + e * stride_de, ds + e * stride_dse, db + e * stride_dse, rn, n_mask,
                 stride_dn, stride_dsn, I, BN, BK, BITS, GROUP, True)
        acc += w_s * y.to(tl.bfloat16).to(tl.float32)
    if HAS_SHARED:
        y = gemv(h_row + TOPK * stride_hs, sdw, sds, sdb, rn, n_mask, stride_sdn, stride_sdsn, IS, BN, BKS, S_BITS,
                 S_GROUP, True)
        acc += tl.load(sw_ptr + t) * y.to(tl.bfloat16).to(tl.float32)
    o_ty = out_ptr.dtype.element_ty
    out = acc.to(o_ty)
    if HAS_RES:
        r = tl.load(res_ptr + t.to(tl.int64) * stride_rt + rn, mask=n_mask, other=0.0)
        out = (r.to(tl.float32) + out.to(tl.float32)).to(o_ty)
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + rn, out, mask=n_mask)


class MoeRouting(NamedTuple):
    ids: torch.Tensor  # [T, k] int32, ascending expert id per row
    weights: torch.Tensor  # [T, k] fp32, aligned with ids
    shared_weight: torch.Tensor  # [T] fp32 sigmoid(shared gate logit) (zeros without a shared expert)
    tiles: object = None  # moe/mma_experts.MmaTiles of the rows (moe_route(tile_rows=)), else None


def _spec(w, name: str) -> WeightSpec:
    return w if isinstance(w, WeightSpec) else WeightSpec.dense(w, name)


def _gemv_bk(spec: WeightSpec, prefer: int) -> int:
    return spec.block_k(prefer)


# The launches' (BN or BE, BK preference, num_warps): launch_table "router.launch" (BE experts a program, warps)
# and "moe_decode.gate_up" / "moe_decode.down" (BN, BK, warps), with what each won against; none changes a token's
# arithmetic across batch sizes (the code a program runs does not depend on T), only the reduction chunking, which
# is fixed per configuration.


def router_row_blocks() -> int:
    """Row blocks of BE experts per program of the many-token router logits (1: _gemv_kernel, one block a program;
    more: _gemv_blocks_kernel, the program's 8 tokens' x read from L1 by every block after the first; never a
    token's bits). Not yet timed, so 1 by default; DELTASERVE_ROUTER_ROW_BLOCKS (utils/tuning.py: an experiment,
    a power of two up to 64)."""
    value = tuning.get("DELTASERVE_ROUTER_ROW_BLOCKS")
    if value & (value - 1):
        raise ValueError(f"DELTASERVE_ROUTER_ROW_BLOCKS must be a power of two up to 64, found {value}")
    return value


def prefill_routes_mma(x: torch.Tensor, r: WeightSpec) -> bool:
    """Whether a prefill chunk x's router logits come from the tensor-core router (triton_router_mma): a router it
    serves. The choice is per weight, never per T, so every chunk of a prompt gets the same arithmetic (chunked ==
    whole). H200 against the decode router's arithmetic: 8 prompts +9.6%, 64 prompts +7.3% (lab/NOTES.md)."""
    return router_mma_fits(x, r)


def router_rows_min() -> int:
    """From how many tokens the router's logits come from the multi-row GEMV (_router_logits; the same bits as the
    per-token launch, so the choice may follow T): launch_table "router.rows_min"."""
    return launch_value("router.rows_min")


@triton.jit
def _topk_kernel(logit_ptr, ids_ptr, wts_ptr, sw_ptr, E, EP: tl.constexpr, TOPK: tl.constexpr,
                 NORMALIZE: tl.constexpr, SHARED_ID: tl.constexpr = -1, PDL: tl.constexpr = False):
    # SHARED_ID >= 0: rows of TOPK + 1 slots, the last one (SHARED_ID, the shared gate's sigmoid sw[t]): the
    # shared expert as one more routed slot (kernels/moe/mma_moe.py stacks it as the last expert)
    pdl_open(PDL)
    pdl_wait(PDL)
    t = tl.program_id(0)
    sel, wts, rank = _topk(logit_ptr + t * E, E, EP, TOPK, NORMALIZE, False)
    rows = tl.arange(0, EP)
    slots: tl.constexpr = TOPK + 1 if SHARED_ID >= 0 else TOPK
    tl.store(ids_ptr + t * slots + rank, rows, mask=sel)
    tl.store(wts_ptr + t * slots + rank, wts, mask=sel)
    if SHARED_ID >= 0:
        tl.store(ids_ptr + t * slots + TOPK, SHARED_ID)
        tl.store(wts_ptr + t * slots + TOPK, tl.load(sw_ptr + t))


def _router_logits(x, r: WeightSpec, g: WeightSpec, has_shared: bool, config,
                   topk: tuple | None = None, norm: tuple | None = None,
                   mma: bool = False, codes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 logits [T, E], shared gate sigmoid [T]) in one launch of (T, cdiv(E, BE) + 1) programs. The x row
    is read raw (inline prep), so no prep launch; one program per BE experts keeps every SM busy even at T = 1
    (E = 256, BE = 4: 65 programs of 8 KB of an 8-bit router each). topk = (ids [T, k], weights [T, k], k,
    normalize): the same launch also applies the routing contract (its last-arriving program per token).
    norm = (residual [T, H], weight [H], eps, offset, (y, r, xs)): x is a mixer's output and every program makes
    the token's add_rms_norm(x, residual) first (the norm kernel's bits), program (t, 0) writing y, r = x + residual
    and y's group sums [T, H / 64] into the three given tensors; the logits are of y (route_normed).
    From router_rows_min() tokens on (a packed router, no topk): two launches instead, the logits from the multi-row
    GEMV (launch_table "router.gemv_rows" tokens a program) and the shared gate's column alone, with the same bits.
    mma (a prefill chunk, prefill_routes_mma): the logits from the tensor-core router at any T (its own bits), the
    shared gate's column alone as above; codes: the router's bf16 codes for it (router_mma_logits(codes=))."""
    t, h = x.shape
    be, warps = config["router"]
    logits = torch.empty(t, r.n, dtype=torch.float32, device=x.device)
    sw = torch.empty(t, dtype=torch.float32, device=x.device)
    r_cg, g_cg = _router_cg(r, be, warps), _router_cg(g, be, warps)
    if mma and (topk is not None or norm is not None):
        raise ValueError("_router_logits: the tensor-core router takes no top-k or norm in its launch")
    if t and (mma or (topk is None and r.bits != 16 and t >= router_rows_min() and norm is None)):
        # many tokens: the logits from the multi-row GEMV (triton_gemv._gemv_kernel: a weight chunk loaded once for
        # "router.gemv_rows" tokens, each row gemv_row's arithmetic with the router's BE and CG, so the same bits; the
        # per-token launch re-reads the 0.5 MB router for every token: ~78 us a layer at pp512), then the shared
        # gate's column of the router launch alone
        if mma:
            router_mma_logits(x, r, logits, codes=codes)  # a prefill's arithmetic: tensor-core MMAs, the same at any T
        elif rows_fit(x, r, r_cg, warps):  # the same bits in a Gluon program: no per-token layout moves (H200, pp512
            # B=1 +4.0% against the Triton rows GEMV below, lab/NOTES.md)
            router_rows_logits(x, r, logits)
        else:
            launch_gemv(x, r, logits, config=(be, r_cg, warps), inline_prep=True, rows=launch_value("router.gemv_rows"),
                        blocks=router_row_blocks())
        _router_kernel[(t, 1)](
            x, r.w, r.scales, r.biases, g.w, g.scales, g.biases, logits, sw, logits, logits, logits,
            r.n, x.stride(0), r.w.stride(-2), r.scales.stride(-2), g.w.stride(-2), g.scales.stride(-2), MAGIC,
            *_no_norm_args(x), H=h, BE=be, R_BITS=r.bits, R_GROUP=r.group, R_CG=r_cg, HAS_SHARED=has_shared,
            G_BITS=g.bits, G_GROUP=g.group, G_CG=g_cg, INLINE=inline_mode(x, True), SHARED_ONLY=True, num_warps=warps,
            **pdl_args(x),
        )
        return logits, sw
    if t:
        ids, wts, k, normalize = topk if topk is not None else (logits, logits, 0, True)
        cnt = arrival_counters(x.device, t) if topk is not None else logits
        grid = (t, triton.cdiv(r.n, be) + 1)
        norm_mode, read = 0, x  # read: the rows the dot products read raw (their INLINE mode)
        if norm is None:
            norm_args = _no_norm_args(x)
        else:  # every program makes the token's norm (program (t, 0) writes it), its y read from a scratch row of
            # its own (1) or made again at the dot product's x loads (2; a dense weight's column keeps the scratch)
            res, nw, eps, offset, (y, r_out, xs) = norm
            norm_mode = 2 if router_norm_read() == "tiles" else 1
            scr = x  # unused: every column makes y at its loads
            if norm_mode == 1 or 16 in (r.bits, g.bits):
                scr = torch.empty(t, grid[1], h, dtype=x.dtype, device=x.device)
                read = scr[:, 0]
            norm_args = (res, nw, y, r_out, xs, scr, res.stride(0), h, eps, offset)
        _router_kernel[grid](
            x, r.w, r.scales, r.biases, g.w, g.scales, g.biases, logits, sw, ids, wts, cnt,
            r.n, x.stride(0), r.w.stride(-2), r.scales.stride(-2), g.w.stride(-2), g.scales.stride(-2), MAGIC,
            *norm_args, H=h, BE=be, R_BITS=r.bits, R_GROUP=r.group, R_CG=r_cg,
            HAS_SHARED=has_shared, G_BITS=g.bits, G_GROUP=g.group, G_CG=g_cg,
            INLINE=inline_mode(read, True), TOPK=k, EP=triton.next_power_of_2(r.n),
            NORMALIZE=normalize, NORM=norm_mode, num_warps=warps, **pdl_args(x),
        )
    return logits, sw


def _no_norm_args(x: torch.Tensor) -> tuple:
    """The router launch's norm arguments when it does not make its input's norm (unused: x in every pointer)."""
    return (x, x, x, x, x, x, 0, 1, 0.0, 0.0)


def default_config() -> dict:
    """The MoE decode kernels' launch configuration from the launch table: {"router": (BE, warps), "gate_up" and
    "down": (BN, BK, warps)}."""
    return {"router": launch_value("router.launch"), "gate_up": launch_value("moe_decode.gate_up"),
            "down": launch_value("moe_decode.down")}


def merged_config(config: dict | None) -> dict:
    """The launch configuration of the MoE decode kernels: default_config(), overridden by an explicit `config`
    (sweeps)."""
    return {**default_config(), **(config or {})}


def topk_warps() -> int:
    """num_warps of the split top-k launch: launch_table "router.topk_warps". The selection does not depend on it;
    the weights' softmax sum follows its layout (a row's order, every row the same), so it is fixed and never
    depends on the batch."""
    return launch_value("router.topk_warps")


def _router_specs(x, router, top_k, shared_gate):
    r = _spec(router, "router")
    t, h = x.shape
    if r.k != h:
        raise ValueError(f"moe router: weight has {r.k} inputs, x has {h} features")
    if not 1 <= top_k <= r.n:
        raise ValueError(f"moe router: top_k {top_k} outside [1, {r.n}] experts")
    if x.stride(-1) != 1:
        raise ValueError("moe: x must be contiguous along H")
    g = _spec(shared_gate, "shared_expert_gate") if shared_gate is not None else r
    if shared_gate is not None and (g.n, g.k) != (1, h):
        raise ValueError(f"moe router: shared_expert_gate shape [{g.n}, {g.k}], expected [1, {h}]")
    return r, g


ROUTER_NORM_MAX_TOKENS = 16  # route_normed's launches: a scratch row of H a program, T x (E / BE + 1) of them


def router_norm_read() -> str:
    """How route_normed's programs read the norm's row for their dot product: "scratch" (each stores y to a scratch
    row of its own and reads it back after a barrier). Making y's values again at the dot product's x loads (the
    kernel's NORM 2, the same bits) was refuted on the H200: batch 1 650.2 / 651.5 -> 643.2 / 646.0 tok/s
    (lab/NOTES.md)."""
    return "scratch"


def router_norm_tokens() -> int:
    """Up to how many tokens the model's MoE blocks take route_normed (the router launch making the block's input
    norm: one launch fewer a layer, the same bits): launch_table "router.norm_tokens" (the batch-1 deployments'
    sizes; what it won against is in the table's docs). Never a token's bits."""
    return launch_value("router.norm_tokens")


def route_normed_fits(t: int, h: int) -> bool:
    """Can route_normed serve t tokens of h features: 1..ROUTER_NORM_MAX_TOKENS tokens, h a power of two (the
    norm's row is one block) and a multiple of 64 (its group sums)."""
    return 1 <= t <= ROUTER_NORM_MAX_TOKENS and h & (h - 1) == 0 and h % 64 == 0


def route_normed(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, offset: float,
                 router, top_k: int, normalize: bool = True, shared_gate=None, shared_slot: int | None = None,
                 separate_topk: bool = False) -> tuple[MoeRouting, torch.Tensor, torch.Tensor, torch.Tensor]:
    """add_rms_norm(x, residual) then moe_route of its output, with the norm made inside the router launch: x
    [T, H] is the mixer's output. Returns (routing, y, r, xs): y = the norm's output [T, H] (the block's input),
    r = bf16(x + residual) [T, H] (the block's residual) and xs = y's group sums [T, H / 64] (fp32, the sums-only
    norm's), bit for bit what triton_norm.add_rms_norm(x, residual, ..., prep=(4, 64), sums_only=True) returns."""
    t, h = x.shape
    if not route_normed_fits(t, h):
        raise ValueError(f"route_normed: {t} tokens of {h} features (1..{ROUTER_NORM_MAX_TOKENS} tokens, H a power "
                         "of two and a multiple of 64)")
    if residual.shape != x.shape or norm_weight.shape != (h,):
        raise ValueError(f"route_normed: residual {tuple(residual.shape)} / norm weight {tuple(norm_weight.shape)} "
                         f"for x {tuple(x.shape)}")
    if residual.stride(-1) != 1 or x.dtype != residual.dtype:
        raise ValueError("route_normed: the residual must be contiguous along H and of x's dtype")
    outs = (torch.empty_like(x), torch.empty_like(x), torch.empty(t, h // 64, dtype=torch.float32, device=x.device))
    routing = moe_route(x, router, top_k, normalize, shared_gate, separate_topk=separate_topk,
                        shared_slot=shared_slot, norm=(residual, norm_weight, float(eps), float(offset), outs))
    return (routing, *outs)


def moe_route(x: torch.Tensor, router, top_k: int, normalize: bool = True, shared_gate=None,
              config=None, separate_topk: bool = False, shared_slot: int | None = None,
              tile_rows: int | None = None, norm: tuple | None = None, prefill: bool = False,
              router_codes: torch.Tensor | None = None) -> MoeRouting:
    """Router logits (fp32) + the routing contract, in one launch (the top-k at each token's last-arriving router
    program); separate_topk: the top-k in a launch of its own (the two-launch path, for timing). x [T, H];
    router [E, H] (WeightSpec or dense tensor); shared_gate [1, H] or None. shared_slot (with a shared gate): ids
    and weights get k + 1 slots, the last (shared_slot, the shared gate's sigmoid) for every token, written by the
    separate top-k launch (taken then whatever separate_topk says: the same bits). tile_rows (with shared_slot):
    the routing's tiles too (MoeRouting.tiles: mma_expert_tiles(ids, shared_slot + 1, tile_rows)'s tensors), for up
    to ROUTE_TILES_MAX_TOKENS tokens from the router's one launch (triton_route_tiles: H200, 64 streams +1.6%
    against the split top-k and tiles launches, lab/NOTES.md), else from the tiles' own launch. norm: the router launch makes its input's norm first (route_normed).
    prefill: x is a prefill chunk's rows; where prefill_routes_mma, its logits come from the tensor-core router
    (triton_router_mma: a prefill's own arithmetic at every chunk size), then the top-k and tiles launches;
    router_codes: the router's codes as bf16 for that kernel (the same bits; fast.router_codes)."""
    config = merged_config(config)
    r, g = _router_specs(x, router, top_k, shared_gate)
    t = x.shape[0]
    mma_logits = prefill and prefill_routes_mma(x, r)
    if mma_logits and norm is not None:
        raise ValueError("moe_route: a prefill on the tensor-core router makes no norm in its launch (route_normed)")
    if shared_slot is not None and shared_gate is None:
        raise ValueError("moe_route: shared_slot needs the shared expert's gate")
    if tile_rows is not None:
        if norm is not None:
            raise ValueError("moe_route: the router's own norm (route_normed) is for launches without tiles")
        if shared_slot is None:
            raise ValueError("moe_route: tile_rows needs shared_slot (the tiles are over the stacked experts)")
        from . import triton_route_tiles as rt

        if not mma_logits and rt.route_tiles_fit(t, shared_slot + 1):
            return MoeRouting(*rt.route_with_tiles(x, r, g, top_k, normalize, shared_slot, tile_rows, config))
        from .mma_experts import mma_expert_tiles

        routing = moe_route(x, router, top_k, normalize, shared_gate, config, separate_topk, shared_slot,
                            prefill=prefill, router_codes=router_codes)
        return routing._replace(tiles=mma_expert_tiles(routing.ids, shared_slot + 1, tile_rows))
    slots = top_k + int(shared_slot is not None)
    ids = torch.empty(t, slots, dtype=torch.int32, device=x.device)
    wts = torch.empty(t, slots, dtype=torch.float32, device=x.device)
    if separate_topk or shared_slot is not None or mma_logits:
        logits, sw = _router_logits(x, r, g, shared_gate is not None, config, norm=norm, mma=mma_logits,
                                    codes=router_codes if mma_logits else None)
        if t:
            _topk_kernel[(t,)](logits, ids, wts, sw, r.n, EP=triton.next_power_of_2(r.n), TOPK=top_k,
                               NORMALIZE=normalize, SHARED_ID=-1 if shared_slot is None else shared_slot,
                               num_warps=topk_warps(), **pdl_args(logits))
    else:
        _, sw = _router_logits(x, r, g, shared_gate is not None, config, (ids, wts, top_k, normalize), norm)
    return MoeRouting(ids, wts, sw)


def _check_experts(gate: WeightSpec, up: WeightSpec, down: WeightSpec, h: int, what: str) -> None:
    lead = gate.w.dim() - 2
    if (gate.n, gate.k) != (up.n, up.k) or gate.bits != up.bits or gate.group != up.group:
        raise ValueError(f"moe {what}: gate [{gate.n}, {gate.k}] and up [{up.n}, {up.k}] must match in shape/format")
    if gate.k != h or down.n != h or down.k != gate.n:
        raise ValueError(f"moe {what}: expected gate/up [.., I, {h}] and down [.., {h}, I], found gate "
                         f"[{gate.n}, {gate.k}], down [{down.n}, {down.k}]")
    if down.w.dim() - 2 != lead or down.bits != gate.bits:
        raise ValueError(f"moe {what}: down must be stacked like gate/up and in the same format")


def moe_weight_specs(x, gate, up, down, shared_gate_proj, shared_up, shared_down, shared_gate, residual):
    """Checked WeightSpecs of an MoE block's experts for x [T, H]: (gate, up, down, shared gate, shared up, shared
    down, has_shared). Without a shared expert the shared slots repeat the routed specs (never read)."""
    g, u, d = _spec(gate, "experts.gate"), _spec(up, "experts.up"), _spec(down, "experts.down")
    h = x.shape[1]
    _check_experts(g, u, d, h, "experts")
    has_shared = shared_gate_proj is not None
    if has_shared != (shared_up is not None) or has_shared != (shared_down is not None) or \
            has_shared != (shared_gate is not None):
        raise ValueError("moe: give all of shared_gate_proj, shared_up, shared_down and shared_gate, or none")
    sg, su, sd = (_spec(w, n) if has_shared else v for w, n, v in
                  ((shared_gate_proj, "shared_expert.gate_proj", g), (shared_up, "shared_expert.up_proj", u),
                   (shared_down, "shared_expert.down_proj", d)))
    if has_shared:
        _check_experts(sg, su, sd, h, "shared expert")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"moe: residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
    return g, u, d, sg, su, sd, has_shared


def moe_decode(
    x: torch.Tensor, router, gate, up, down, top_k: int, *, normalize: bool = True,
    shared_gate_proj=None, shared_up=None, shared_down=None, shared_gate=None,
    residual: torch.Tensor | None = None, return_routing: bool = False, out: torch.Tensor | None = None,
    config: dict | None = None,
):
    """The MoE block for T tokens x [T, H] (bf16). Weights are WeightSpec (affine) or dense tensors:
    router [E, H]; routed gate/up [E, I, H], down [E, H, I] (fused gate_up_proj: pass the views [:, :I], [:, I:]);
    shared expert gate/up [IS, H], down [H, IS] and its gate [1, H] (all four or none). Returns out [T, H] (with
    residual added when given), and the routing too when return_routing. config overrides default_config()."""
    config = merged_config(config)
    r, gsp = _router_specs(x, router, top_k, shared_gate)
    t, h = x.shape
    g, u, d, sg, su, sd, has_shared = moe_weight_specs(
        x, gate, up, down, shared_gate_proj, shared_up, shared_down, shared_gate, residual
    )
    if g.w.dim() != 3 or g.w.shape[0] != r.n:
        raise ValueError(f"moe experts: gate/up/down must be stacked [E={r.n}, ..], found {tuple(g.w.shape)}")
    out = torch.empty_like(x) if out is None else out
    ids = torch.empty(t, top_k, dtype=torch.int32, device=x.device)
    wts = torch.empty(t, top_k, dtype=torch.float32, device=x.device)
    if t == 0:
        return (out, MoeRouting(ids, wts, wts[:, 0])) if return_routing else out
    logits, sw = _router_logits(x, r, gsp, has_shared, config)
    i_r, i_s = g.n, (sg.n if has_shared else 0)
    slots = top_k + int(has_shared)
    hbuf = torch.empty(t, slots, max(i_r, i_s), dtype=torch.bfloat16, device=x.device)
    bn, bk, warps = config["gate_up"]
    _gate_up_kernel[(t * slots, triton.cdiv(max(i_r, i_s), bn))](
        x, logits, ids, wts, hbuf, g.w, g.scales, g.biases, u.w, u.scales, u.biases,
        sg.w, sg.scales, sg.biases, su.w, su.scales, su.biases,
        r.n, i_r, i_s, x.stride(0), hbuf.stride(0), hbuf.stride(1),
        g.w.stride(0), g.w.stride(1), g.scales.stride(0), g.scales.stride(1),
        u.w.stride(0), u.w.stride(1), u.scales.stride(0), u.scales.stride(1),
        sg.w.stride(-2), sg.scales.stride(-2), su.w.stride(-2), su.scales.stride(-2),
        H=h, EP=triton.next_power_of_2(r.n), TOPK=top_k, NORMALIZE=normalize, SLOTS=slots, BN=bn,
        BK=_gemv_bk(g, bk), BITS=g.bits, GROUP=g.group, S_BITS=sg.bits, S_GROUP=sg.group, S_BK=_gemv_bk(sg, bk),
        num_warps=warps,
    )
    res = residual if residual is not None else x
    bn, bk, warps = config["down"]
    _down_combine_kernel[(t, triton.cdiv(h, bn))](
        hbuf, ids, wts, sw, res, out, d.w, d.scales, d.biases, sd.w, sd.scales, sd.biases,
        h, hbuf.stride(0), hbuf.stride(1), d.w.stride(0), d.w.stride(1), d.scales.stride(0),
        d.scales.stride(1), sd.w.stride(-2), sd.scales.stride(-2), res.stride(0), out.stride(0),
        I=i_r, IS=max(i_s, 1) if has_shared else i_r,
        TOPK=top_k, HAS_SHARED=has_shared, HAS_RES=residual is not None, BN=bn, BK=_gemv_bk(d, bk),
        BKS=_gemv_bk(sd, bk), BITS=d.bits, GROUP=d.group, S_BITS=sd.bits, S_GROUP=sd.group, num_warps=warps,
    )
    return (out, MoeRouting(ids, wts, sw)) if return_routing else out

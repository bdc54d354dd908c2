"""The routing of a decode-sized tensor-core MoE block and its expert tiles in the router's one launch.

A 64-stream step's block took four launches before its experts: the router's logits, the top-k, and one program
sorting the 576 (token, slot) rows by expert (`triton_affine._tiles_one_kernel`: ~8.8 us a layer, a bitonic sort of
1,024 keys, lab/NOTES.md). Here the router launch does all of it, as two levels of last arrival
(`triton_sync.last_arrival`):

- each token's last-arriving router program applies the routing contract (`_topk`: the split launch's code, so the
  same ids and weights), writes the shared expert as slot k, and sets the token's bit in a per-expert bitmap
  (bitmap[e, t // 32] |= 1 << t % 32, an atomic or: the result does not depend on the order of arrival);
- the last token to get there builds the tiles from the bitmap: an expert's row count is its bits' popcount, its
  start the prefix sum of the counts, the tile table `_write_tile_table`'s, and row (t, s) of expert e goes to
  start[e] + the number of e's tokens below t. Each token picks an expert at most once, so that is the stable
  sort by expert of `expert_tiles` (the same four tensors, bit for bit), without a sort.

The bitmap and the starts' scratch live in the arrival counters' buffer (zero outside a launch: the last program
clears them after reading). Tokens: at most ROUTE_TILES_MAX_TOKENS (two bitmap words an expert).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant.triton_affine import _write_tile_table
from ..quant.triton_gemv import MAGIC
from ..quant.triton_gemv_inline import inline_mode
from ..triton_pdl import pdl_args, pdl_open
from ..triton_sync import arrival_counters, last_arrival
from .triton_router_common import _router_cg, _router_column, _topk

ROUTE_TILES_MAX_TOKENS = 64  # a 64-stream decode step
BITMAP_WORDS = ROUTE_TILES_MAX_TOKENS // 32  # the most int32 words of tokens an expert's bitmap row holds
BITMAP_AT = 128  # the bitmap's offset in the arrival counters (the per-token counters and the launch's one before it)


def route_tiles_fit(tokens: int, tile_experts: int) -> bool:
    """Whether `tokens` tokens over `tile_experts` experts (the shared one included) fit the fused launch: the
    bitmap's words and the starts' scratch inside the arrival counters that exist before any graph capture."""
    from ..triton_sync import MIN_COUNTERS

    tep = triton.next_power_of_2(tile_experts)
    return 0 < tokens <= ROUTE_TILES_MAX_TOKENS and BITMAP_AT + tep * BITMAP_WORDS + tep <= MIN_COUNTERS


@triton.jit
def _popcount32(v):
    """The set bits of each int32 lane (a SWAR count on uint32: plain integer ops, which the interpreter runs too)."""
    u = v.to(tl.uint32, bitcast=True)
    u = u - ((u >> 1) & 0x55555555)
    u = (u & 0x33333333) + ((u >> 2) & 0x33333333)
    u = (u + (u >> 4)) & 0x0F0F0F0F
    return ((u * 0x01010101) >> 24).to(tl.int32)


@triton.jit
def _router_tiles_kernel(
    x_ptr, rw_ptr, rs_ptr, rb_ptr, gw_ptr, gs_ptr, gb_ptr, logit_ptr, sg_ptr, ids_ptr, wts_ptr, cnt_ptr,
    tile_e_ptr, tile_lo_ptr, tile_hi_ptr, order_ptr,
    T, E, TILE_E, MAX_TILES, stride_xt, stride_rn, stride_rsn, stride_gn, stride_gsn, magic, H: tl.constexpr,
    BE: tl.constexpr, R_BITS: tl.constexpr, R_GROUP: tl.constexpr, R_CG: tl.constexpr, G_BITS: tl.constexpr,
    G_GROUP: tl.constexpr, G_CG: tl.constexpr, INLINE: tl.constexpr, TOPK: tl.constexpr, EP: tl.constexpr,
    NORMALIZE: tl.constexpr, SHARED_ID: tl.constexpr, TEP: tl.constexpr, TW: tl.constexpr,
    MP: tl.constexpr, R: tl.constexpr, TB: tl.constexpr, BOFF: tl.constexpr, PDL: tl.constexpr = False,
):
    # grid (T, cdiv(E, BE) + 1), the router launch's: program (t, j) is router column j of token t (_router_column,
    # as in _router_kernel: the same logits and shared-gate sigmoid). cnt: the arrival counters, [0, T) per token,
    # [T] the launch's, the bitmap [TEP, TW] int32 at BOFF (BITMAP_AT), the starts' scratch [TEP] after it; all zero
    # outside a launch. PDL: the column waits inside gemv_row (or before the shared column's store), before any store.
    pdl_open(PDL)
    t = tl.program_id(0)
    _router_column(x_ptr, rw_ptr, rs_ptr, rb_ptr, gw_ptr, gs_ptr, gb_ptr, logit_ptr, sg_ptr, E, stride_xt, stride_rn,
                   stride_rsn, stride_gn, stride_gsn, magic, H, BE, R_BITS, R_GROUP, R_CG, True, G_BITS, G_GROUP,
                   G_CG, INLINE, PDL)
    if last_arrival(cnt_ptr + t, tl.num_programs(1)):
        # the token's routing: the split top-k launch's (_topk_kernel with SHARED_ID), from L2
        S: tl.constexpr = TOPK + 1
        sel, wts, rank = _topk(logit_ptr + t * E, E, EP, TOPK, NORMALIZE, True)
        ex = tl.arange(0, EP)
        tl.store(ids_ptr + t * S + rank, ex, mask=sel)
        tl.store(wts_ptr + t * S + rank, wts, mask=sel)
        tl.store(ids_ptr + t * S + TOPK, SHARED_ID)
        tl.store(wts_ptr + t * S + TOPK, tl.load(sg_ptr + t, cache_modifier=".cg"))
        bits_ptr = cnt_ptr + BOFF
        bit = 1 << (t % 32)  # int32: bit 31 is the sign bit, the same word
        tl.atomic_or(bits_ptr + ex * TW + t // 32, bit, mask=sel, sem="relaxed")
        tl.atomic_or(bits_ptr + SHARED_ID * TW + t // 32, bit, sem="relaxed")
        if last_arrival(cnt_ptr + T, T):
            _tiles_from_bitmap(ids_ptr, bits_ptr, bits_ptr + TEP * TW, tile_e_ptr, tile_lo_ptr, tile_hi_ptr, order_ptr,
                               T * S, TILE_E, MAX_TILES, S, TEP, TW, MP, R, TB)


@triton.jit
def _tiles_from_bitmap(ids_ptr, bits_ptr, starts_ptr, tile_e_ptr, tile_lo_ptr, tile_hi_ptr, order_ptr, M, TILE_E,
                       MAX_TILES, S: tl.constexpr, TEP: tl.constexpr, TW: tl.constexpr, MP: tl.constexpr,
                       R: tl.constexpr, TB: tl.constexpr):
    """expert_tiles' four tensors for the M = T * S rows of ids [T, S] from the bitmap [TEP, TW] of the tokens each
    expert holds (all tokens' bits set: called at the launch's last arrival), then the bitmap and the starts'
    scratch [TEP] cleared. Row r = t * S + s of expert e sorts to start[e] + popcount(e's bits below t): the stable
    order, since a token holds an expert in one slot at most."""
    ex = tl.arange(0, TEP)
    wk = tl.arange(0, TW)
    at = ex[:, None] * TW + wk[None, :]
    total = tl.sum(_popcount32(tl.load(bits_ptr + at, cache_modifier=".cg")), axis=1)  # [TEP] rows an expert
    starts = tl.cumsum(total, 0) - total
    tl.store(starts_ptr + ex, starts)
    _write_tile_table(starts, total, ex, TILE_E, MAX_TILES, tile_e_ptr, tile_lo_ptr, tile_hi_ptr, R, TB)
    tl.debug_barrier()  # the starts stored by every thread before any reads them back
    r = tl.arange(0, MP)
    live = r < M
    tok = r // S
    e = tl.load(ids_ptr + r, mask=live, other=0, cache_modifier=".cg")
    pos = tl.load(starts_ptr + e, mask=live, other=0)
    for w in tl.static_range(TW):
        word = tl.load(bits_ptr + e * TW + w, mask=live, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
        below = tl.minimum(tl.maximum(tok - w * 32, 0), 31).to(tl.uint32)  # e's tokens of this word below tok
        ones = (tl.full((MP,), 1, tl.uint32) << below) - 1
        part = tl.where(tok >= w * 32 + 32, word, tl.where(tok > w * 32, word & ones, 0))
        pos += _popcount32(part.to(tl.int32, bitcast=True))
    tl.store(order_ptr + pos, r, mask=live)
    tl.debug_barrier()  # every read of the bitmap and the starts done before they are cleared
    tl.store(bits_ptr + at, tl.zeros((TEP, TW), dtype=tl.int32))
    tl.store(starts_ptr + ex, tl.zeros((TEP,), dtype=tl.int32))


def route_with_tiles(x, r, g, top_k: int, normalize: bool, shared_slot: int, tile_rows: int, config: dict):
    """(ids [T, k + 1], weights [T, k + 1], shared weight [T], MmaTiles) from one launch: moe_route's routing with
    the shared expert as slot k (shared_slot), and the tiles of `tile_rows` rows over shared_slot + 1 experts that
    mma_expert_tiles would build for those ids. r, g: the router's and the shared gate's WeightSpecs."""
    from .mma_experts import MmaTiles

    t, h = x.shape
    tile_experts = shared_slot + 1
    if not route_tiles_fit(t, tile_experts):
        raise ValueError(f"route_with_tiles: {t} tokens over {tile_experts} experts do not fit the fused launch "
                         f"(at most {ROUTE_TILES_MAX_TOKENS} tokens)")
    if tile_rows not in (8, 16, 32, 64):
        raise ValueError(f"route_with_tiles: rows per tile must be 8, 16, 32 or 64, found {tile_rows}")
    slots = top_k + 1
    m = t * slots
    dev = x.device
    be, warps = config["router"]
    tep = triton.next_power_of_2(tile_experts)
    tw = triton.cdiv(t, 32)  # the bitmap's words an expert (1 or 2: a power of two)
    max_tiles = triton.cdiv(m, tile_rows) + min(tile_experts, m)
    ids = torch.empty(t, slots, dtype=torch.int32, device=dev)
    wts = torch.empty(t, slots, dtype=torch.float32, device=dev)
    logits = torch.empty(t, r.n, dtype=torch.float32, device=dev)
    sw = torch.empty(t, dtype=torch.float32, device=dev)
    tile_e, lo, hi = (torch.empty(max_tiles, dtype=torch.int32, device=dev) for _ in range(3))
    order = torch.empty(m, dtype=torch.int32, device=dev)
    cnt = arrival_counters(dev, BITMAP_AT + tep * tw + tep)
    _router_tiles_kernel[(t, triton.cdiv(r.n, be) + 1)](
        x, r.w, r.scales, r.biases, g.w, g.scales, g.biases, logits, sw, ids, wts, cnt, tile_e, lo, hi, order,
        t, r.n, tile_experts, max_tiles, x.stride(0), r.w.stride(-2), r.scales.stride(-2), g.w.stride(-2),
        g.scales.stride(-2), MAGIC, H=h, BE=be, R_BITS=r.bits, R_GROUP=r.group, R_CG=_router_cg(r, be, warps),
        G_BITS=g.bits, G_GROUP=g.group, G_CG=_router_cg(g, be, warps), INLINE=inline_mode(x, True), TOPK=top_k,
        EP=triton.next_power_of_2(r.n), NORMALIZE=normalize, SHARED_ID=shared_slot,
        TEP=tep, TW=tw, MP=max(16, triton.next_power_of_2(m)), R=tile_rows, TB=64, BOFF=BITMAP_AT,
        num_warps=warps,
        **pdl_args(x),
    )
    return ids, wts, sw, MmaTiles(tile_e, lo, hi, order, tile_rows)


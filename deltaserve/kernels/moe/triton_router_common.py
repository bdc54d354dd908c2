"""The MoE router's pieces shared by its launches: one token's router logits column (`_router_column`, with the
shared gate's sigmoid in the launch's last column), the routing contract on a token's logits (`_topk`: ties to the
lower id, slots in ascending id, weights normalised), the top-k's selection form and the router rows' chunking.

moe_route's launches (triton_decode.py) and the decode-tile router (triton_route_tiles.py) both build on them; they
live here, below both, so neither of those modules imports the other's helpers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..quant.triton_gemv import chunk_groups, gemv_row, row_run_config
from ..triton_common import WeightSpec
from ..triton_pdl import pdl_wait


@triton.jit
def _router_column(x_ptr, rw_ptr, rs_ptr, rb_ptr, gw_ptr, gs_ptr, gb_ptr, logit_ptr, sg_ptr, E, stride_xt, stride_rn,
                   stride_rsn, stride_gn, stride_gsn, magic, H: tl.constexpr, BE: tl.constexpr, R_BITS: tl.constexpr,
                   R_GROUP: tl.constexpr, R_CG: tl.constexpr, HAS_SHARED: tl.constexpr, G_BITS: tl.constexpr,
                   G_GROUP: tl.constexpr, G_CG: tl.constexpr, INLINE: tl.constexpr, PDL_WAIT: tl.constexpr):
    """Program (t, j) of a router launch of (T, cdiv(E, BE) + 1) programs: column j < cdiv(E, BE) stores the fp32
    logits of experts j*BE .. j*BE+BE-1 of token t (gemv_row: the full K unrolled, two chunks ahead), the last
    column the shared gate's sigmoid. PDL_WAIT: the caller's PDL wait, inside gemv_row or _router_shared_gate."""
    t = tl.program_id(0)
    j = tl.program_id(1)
    x_row = x_ptr + t.to(tl.int64) * stride_xt
    rows = j * BE + tl.arange(0, BE)
    if j * BE < E:
        e_mask = rows < E
        logits = gemv_row(x_row, x_row, x_row, rw_ptr, rs_ptr, rb_ptr, rows, e_mask, stride_rn, stride_rsn, magic,
                          H, R_BITS, R_GROUP, BE, R_CG, INLINE, PDL_WAIT)
        tl.store(logit_ptr + t * E + rows, logits, mask=e_mask)
    else:
        _router_shared_gate(x_row, gw_ptr, gs_ptr, gb_ptr, sg_ptr, t, stride_gn, stride_gsn, magic, H, BE, HAS_SHARED,
                            G_BITS, G_GROUP, G_CG, INLINE, PDL_WAIT)


@triton.jit
def _router_shared_gate(x_row, gw_ptr, gs_ptr, gb_ptr, sg_ptr, t, stride_gn, stride_gsn, magic, H: tl.constexpr,
                        BE: tl.constexpr, HAS_SHARED: tl.constexpr, G_BITS: tl.constexpr, G_GROUP: tl.constexpr,
                        G_CG: tl.constexpr, INLINE: tl.constexpr, PDL_WAIT: tl.constexpr):
    """The router launch's shared-gate column: sg[t] = sigmoid(x . w_sg) (0 without a shared expert). PDL_WAIT: the
    caller's PDL wait happens here (inside gemv_row once its first weights are requested, else before the store)."""
    one = tl.arange(0, BE)
    if HAS_SHARED:
        sg = gemv_row(x_row, x_row, x_row, gw_ptr, gs_ptr, gb_ptr, one, one < 1, stride_gn, stride_gsn, magic,
                      H, G_BITS, G_GROUP, BE, G_CG, INLINE, PDL_WAIT)
        tl.store(sg_ptr + t + one, tl.sigmoid(sg), mask=one < 1)
    else:
        pdl_wait(PDL_WAIT)
        tl.store(sg_ptr + t + one, tl.zeros((BE,), dtype=tl.float32), mask=one < 1)


@triton.jit
def _order_keys(logits, rows, EP: tl.constexpr):
    """int64 keys whose order is (logit, then LOWER id) for fp32 logits [EP]: the fp32 bits made monotonic as a
    signed int32 (negative floats' magnitude bits flipped) in the high word, EP-1-id in the low word. -inf (the
    masked lanes) orders below every finite logit, -0 equals +0. NaN logits are outside the routing contract."""
    b = tl.where(logits == 0.0, 0.0, logits).to(tl.int32, bitcast=True)  # -0 ties with +0, as floats compare
    mono = b ^ ((b >> 31) & 0x7FFFFFFF)
    return (mono.to(tl.int64) << 32) | (EP - 1 - rows).to(tl.int64)


@triton.jit
def _topk(logit_row, E, EP: tl.constexpr, TOPK: tl.constexpr, NORMALIZE: tl.constexpr, FRESH: tl.constexpr = False):
    """The routing contract on one token's logits: (selected mask [EP], weights [EP], rank [EP]) where rank is
    the slot of a selected expert in ascending id order, ties going to the lower id (_order_keys: the id is in the
    keys, so they are distinct). Triton's bitonic top-k finds the k-th largest key and the keys at or above it are
    the selection; the softmax's max and normaliser come from the k best keys, which every thread then holds (sm_90,
    E = 256, k = 8: 17 barriers, against 33 for k dependent rounds of a max over the keys and 23 for two reductions
    over the lanes: H200, Qwen3.6-35B-A3B q4, tg128 @ d512 B=1, rounds 610.8 / 611.2 tok/s, then the max and
    normaliser over the lanes 623.6 / 623.6, this form 626.0 / 624.5; lab/NOTES.md). FRESH: the logits were written
    by other programs of this launch, read them from L2 (".cg"), not from this SM's L1."""
    rows = tl.arange(0, EP)
    e_mask = rows < E
    if FRESH:
        logits = tl.load(logit_row + rows, mask=e_mask, other=float("-inf"), cache_modifier=".cg")
    else:
        logits = tl.load(logit_row + rows, mask=e_mask, other=float("-inf"))
    work = _order_keys(logits, rows, EP)
    KP: tl.constexpr = 1 << (TOPK - 1).bit_length()  # tl.topk takes a power of two
    best = tl.topk(work, KP)  # [KP] the largest keys, descending (bitonic top-k: no serial rounds)
    kk = tl.arange(0, KP)
    thr = tl.sum(tl.where(kk == TOPK - 1, best, 0), axis=0)  # the k-th largest key
    sel = work >= thr
    # the best keys' logits back from their high words (_order_keys' map is its own inverse). top may be +0 where
    # max(logits) is -0: x - top is the same either way
    hi = (best >> 32).to(tl.int32)
    best_logits = (hi ^ ((hi >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    top = tl.max(best_logits, axis=0)
    if NORMALIZE:
        # the normaliser adds the k terms one after another in key order (largest first), each taken out of the
        # KP-element result exactly (one term and zeros): the same bits in every launch, whatever its warps and so
        # the result's layout (a tree sum over the layout's lanes rounded differently in the router's launch and in
        # the separate top-k launch: routing weights one bit apart, so a 16-token verify routed by one and a
        # decode step by the other gave other bits, tests/gpu/test_gemv_gpu.py::test_moe_v2_fused)
        terms = tl.exp(best_logits - top)
        norm = tl.sum(tl.where(kk == 0, terms, 0.0), axis=0)
        for i in tl.static_range(1, TOPK):
            norm = norm + tl.sum(tl.where(kk == i, terms, 0.0), axis=0)
        wts = tl.where(sel, tl.exp(logits - top), 0.0) / norm
    else:
        lse = top + tl.log(tl.sum(tl.where(e_mask, tl.exp(logits - top), 0.0), axis=0))
        wts = tl.exp(logits - lse)
    rank = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    return sel, wts, rank


def _router_cg(spec: WeightSpec, be: int, warps: int) -> int:
    """CG of a router (or shared gate) row: the row run of triton_gemv.row_run_config when it fits the launch's
    warps (H = 2048 at 8 bits: the whole K, each thread one 128-bit load per expert row and x read once for the
    BE rows), else chunk_groups. Fixed per weight format: never depends on T."""
    rr = row_run_config(spec, be)
    return rr[1] if rr is not None and rr[2] == warps else chunk_groups(spec, be)

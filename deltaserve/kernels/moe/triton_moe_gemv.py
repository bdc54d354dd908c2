"""MoE block for decode (T <= ~16 tokens), restructured for parallelism on top of the decode GEMV
(`kernels/quant/triton_gemv.py`). Same signature and meaning as `kernels/moe/triton_decode.py::moe_decode`:

  router       router logits fp32 [T, E] and the shared gate's sigmoid (triton_decode._router_kernel)
  gate/up      grid (T * SLOTS, cdiv(I, BN)): slot s < k is the token's s-th picked expert, slot k the shared one;
               each routed program applies the routing contract (top-k, ties to the lower id, ids ascending) to
               its token's logits itself, column block 0 publishes ids/weights (no top-k launch);
               h = bf16(bf16(SiLU(bf16 g)) * bf16 u) into hbuf [T, SLOTS, I]
  down+combine grid (T, cdiv(H, BN)): part_s = w_s * bf16(h_s Wd_s^T) in fp32 for s = 0..SLOTS-1 in that fixed
               order (ascending expert id, then shared; w = the shared gate's sigmoid for the shared slot),
               out = bf16(part_0 + part_1 + ...), + residual: bf16(r + out)

Three launches, none for preparing x: every GEMV reads its bf16 rows raw (gemv_row's INLINE; inline_prep=False and
fuse_topk=False restore the prep and top-k launches for timing). MoeLaunch(fuse_down_combine=False) splits the last
launch in two, the same bits: down, grid (T * SLOTS, cdiv(H, BN)), writes every part_s to a buffer [T * SLOTS, H]
fp32, and combine, grid (T, cdiv(H, BC)), sums them in the same order (each part is slot_part's in both, its
product never contracted into the sum: _mul_rn). Many small programs (BN = 8 features, the full K each) instead
of a few long ones. Every GEMV row is computed by
`gemv_row`, whose arithmetic depends on the weight format and shape only, and every reduction has one fixed order,
so a token's output never depends on the other tokens of the launch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..quant.triton_gemv import (
    MAGIC, chunk_dot, load_chunk, chunk_groups, gemv_row, gemv_row_pair, prep_x, row_run_config, unit,
)
from ..quant.triton_gemv_inline import inline_mode
from ..triton_common import DENSE_BITS, WeightSpec
from ..triton_pdl import pdl_args, pdl_open, pdl_wait
from .triton_decode import (
    DEFAULT_CONFIG,
    MoeRouting,
    _router_logits,
    _router_specs,
    _silu_mul_bf16,
    _spec,
    moe_route,
    moe_weight_specs,
    slot_expert,
)

BN = 8  # features per program (down: of H)
GATE_UP_BN = 4  # features of I per gate/up program, over the whole K (row runs): H200 sweep T=1 19.76 -> 16.94 us
BC = 256  # features per combine program (the split down + combine, MoeLaunch.fuse_down_combine=False)


@dataclass(frozen=True)
class MoeLaunch:
    """Launch shape of moe_decode_v2's gate/up, down and combine kernels (the defaults are the tuned-by-default
    constants above). bn: features per program; cg: groups per
    K chunk (None: chunk_groups(weight, bn), i.e. it shrinks as bn grows; an int holds a weight's chunking, and so
    its per-row summation order, fixed while bn changes); bc: features per combine program. fuse_down_combine:
    the down projection and the combine in one launch (down's bn and warps); False: the down and combine launches
    of their own (combine_bc/_warps), the same bits, kept for A/Bs. Every field is fixed per call and none
    depends on T, so a token's arithmetic never depends on the other tokens of the launch."""

    gate_up_bn: int = GATE_UP_BN
    gate_up_warps: int = 4
    gate_up_cg: int | None = None
    gate_up_row_run: bool = True  # CG and warps from triton_gemv.row_run_config (gate_up_cg/_warps unused then)
    down_bn: int = BN
    down_warps: int = 2  # H200 sweep, T = 1: 25.4 -> 24.5 us per MoE block against 4 warps, same bits
    down_cg: int | None = None
    combine_bc: int = BC
    combine_warps: int = 4
    gate_up_maxnreg: int | None = None  # register cap per thread (Triton's maxnreg), None: the compiler's choice
    down_maxnreg: int | None = None
    fuse_down_combine: bool = True
    gate_up_loop: int = 1  # blocks of gate_up_bn features per gate/up program (row runs only; swiglu_blocks)

    def __post_init__(self):
        for name in ("gate_up_bn", "gate_up_warps", "down_bn", "down_warps", "combine_bc", "combine_warps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"MoeLaunch.{name} = {v!r}: must be a power of two >= 1")
        for name in ("gate_up_cg", "down_cg"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1 or v & (v - 1)):
                raise ValueError(f"MoeLaunch.{name} = {v!r}: must be None or a power of two >= 1")
        for name in ("gate_up_maxnreg", "down_maxnreg"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or not 24 <= v <= 255 or v % 8):
                raise ValueError(f"MoeLaunch.{name} = {v!r}: must be None or a multiple of 8 in 24..255")
        if not isinstance(self.gate_up_loop, int) or not 1 <= self.gate_up_loop <= 16:
            raise ValueError(f"MoeLaunch.gate_up_loop = {self.gate_up_loop!r}: must be an integer in 1..16")
        if not isinstance(self.fuse_down_combine, bool):
            raise ValueError(f"MoeLaunch.fuse_down_combine = {self.fuse_down_combine!r}: must be a bool")


def _env_launch() -> MoeLaunch:
    """MoeLaunch(), with two timing switches for in-model A/Bs (bench/NOTES.md): env DELTASERVE_MOE_LAUNCH=
    "bn,warps,cg/bn,warps,cg" (cg 0: None) sets the gate/up and down shapes, DELTASERVE_MOE_DOWN_COMBINE=fused|split
    (default fused) the down and combine in one launch or two."""
    mode = os.environ.get("DELTASERVE_MOE_DOWN_COMBINE") or "fused"
    if mode not in ("fused", "split"):
        raise ValueError(f"DELTASERVE_MOE_DOWN_COMBINE={mode!r}: expected 'fused' or 'split'")
    fuse = mode == "fused"
    loop = os.environ.get("DELTASERVE_MOE_GATE_UP_LOOP") or str(MoeLaunch.gate_up_loop)
    if not loop.isdigit() or not 1 <= int(loop) <= 16:
        raise ValueError(f"DELTASERVE_MOE_GATE_UP_LOOP={loop!r}: expected an integer in 1..16")
    value = os.environ.get("DELTASERVE_MOE_LAUNCH")
    if not value:
        return MoeLaunch(fuse_down_combine=fuse, gate_up_loop=int(loop))
    try:
        (gb, gw, gc), (db, dw, dc) = (tuple(int(v) for v in part.split(",")) for part in value.split("/"))
    except ValueError:
        raise ValueError(f"DELTASERVE_MOE_LAUNCH={value!r}: expected 'bn,warps,cg/bn,warps,cg'") from None
    return MoeLaunch(gate_up_bn=gb, gate_up_warps=gw, gate_up_cg=gc or None, gate_up_row_run=False, down_bn=db,
                     down_warps=dw, down_cg=dc or None, fuse_down_combine=fuse, gate_up_loop=int(loop))


def _gate_up_shape(g: WeightSpec, sg: WeightSpec, launch: MoeLaunch) -> tuple[int, int, int]:
    """(CG of the routed gate/up, CG of the shared ones, num_warps) of the gate/up launch. Row runs
    (launch.gate_up_row_run, triton_gemv.row_run_config): each program's BN rows over the whole K = H, one 128-bit
    load per thread and row, so a thread reads its x positions once for all BN rows of both weights (H = 2048,
    q4: CG 32, 2 warps); weights whose rows are too short for it (dense, or under 128 words) keep the chunked
    shape. Fixed per weight format: never depends on T."""
    bn = launch.gate_up_bn
    if launch.gate_up_row_run:
        rr, srr = row_run_config(g, bn), row_run_config(sg, bn)
        if rr is not None:
            return rr[1], srr[1] if srr is not None else _cg(sg, bn, None), rr[2]
    return _cg(g, bn, launch.gate_up_cg), _cg(sg, bn, launch.gate_up_cg), launch.gate_up_warps


def _cg(spec: WeightSpec, bn: int, cg: int | None) -> int:
    """CG for a weight under a launch shape: chunk_groups(spec, bn) (the default), or cg if it divides K."""
    if cg is None:
        return chunk_groups(spec, bn)
    if spec.k % (cg * _group(spec)):
        raise ValueError(f"moe_decode_v2: a chunk of {cg} x {_group(spec)} does not divide K = {spec.k}")
    return cg


@triton.jit
def swiglu_block(x_row, xp_row, xs_row, gw, gs, gb, uw, us, ub, h_row, rn, n_mask, stride_gn, stride_gsn,
                 stride_un, stride_usn, magic, K: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr,
                 BN: tl.constexpr, CG: tl.constexpr, INLINE: tl.constexpr):
    """h[rn] = bf16 SwiGLU of one x row against rows rn of a gate and an up weight (an expert's base pointers):
    the one place the MoE decode computes a (token, slot) gate/up block. Both weights in one gemv_row_pair (the
    bits of two gemv_row calls, the up weight's loads issued alongside the gate's)."""
    g, u = gemv_row_pair(x_row, xp_row, xs_row, gw, gs, gb, uw, us, ub, rn, n_mask, stride_gn, stride_gsn,
                         stride_un, stride_usn, magic, K, BITS, GROUP, BN, CG, INLINE, False, True)
    tl.store(h_row + rn, _silu_mul_bf16(g, u), mask=n_mask)


@triton.jit
def swiglu_blocks(x_row, xp_row, xs_row, gw, gs, gb, uw, us, ub, h_row, rn, n_max, stride_gn, stride_gsn,
                  stride_un, stride_usn, magic, K: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr,
                  BN: tl.constexpr, CG: tl.constexpr, INLINE: tl.constexpr, LOOP: tl.constexpr):
    """swiglu_block for LOOP consecutive blocks of BN features from rn (features < n_max), each block's gate and
    up words requested before the previous block is reduced (pinned there by a barrier: ptxas sinks loads to
    their use). Row runs only (the whole K in one chunk), where gemv_row_pair is one load_chunk and one
    chunk_dot per weight: the same per-block instructions, so the same bits as LOOP programs of one block."""
    if LOOP == 1:
        swiglu_block(x_row, xp_row, xs_row, gw, gs, gb, uw, us, ub, h_row, rn, rn < n_max, stride_gn, stride_gsn,
                     stride_un, stride_usn, magic, K, BITS, GROUP, BN, CG, INLINE)
    else:
        tl.static_assert(K == CG * GROUP and BITS != 16, "gate/up blocks per program need packed row runs")
        n_mask = rn < n_max
        cur_g = load_chunk(gw, gs, gb, rn.to(tl.int64), n_mask, stride_gn, stride_gsn, 0, BITS, GROUP, BN, CG)
        cur_u = load_chunk(uw, us, ub, rn.to(tl.int64), n_mask, stride_un, stride_usn, 0, BITS, GROUP, BN, CG)
        for i in tl.static_range(LOOP):
            rn_next = rn + BN
            mask_next = rn_next < n_max
            nxt_g = cur_g
            nxt_u = cur_u
            if i + 1 < LOOP:
                nxt_g = load_chunk(gw, gs, gb, rn_next.to(tl.int64), mask_next, stride_gn, stride_gsn, 0, BITS,
                                    GROUP, BN, CG)
                nxt_u = load_chunk(uw, us, ub, rn_next.to(tl.int64), mask_next, stride_un, stride_usn, 0, BITS,
                                    GROUP, BN, CG)
                tl.debug_barrier()
            zero = tl.zeros((BN, CG), dtype=tl.float32)
            g = tl.sum(chunk_dot(zero, cur_g, magic, x_row, xp_row, xs_row, 0, K, BITS, GROUP, BN, CG, INLINE), 1)
            u = tl.sum(chunk_dot(zero, cur_u, magic, x_row, xp_row, xs_row, 0, K, BITS, GROUP, BN, CG, INLINE), 1)
            tl.store(h_row + rn, _silu_mul_bf16(g, u), mask=n_mask)
            cur_g = nxt_g
            cur_u = nxt_u
            rn = rn_next
            n_mask = mask_next


@triton.jit
def _mul_rn(a, b, MUL_RN: tl.constexpr):
    """a * b in fp32, rounded on its own. MUL_RN: PTX mul.rn, which ptxas never contracts into an FMA with a later
    add (Triton's fp fusion turns `acc += w * y` into one FMA, a different rounding); off only in the interpreter
    (no inline asm there, and numpy never contracts). The same bits either way: IEEE round to nearest."""
    if MUL_RN:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return a * b


@triton.jit
def slot_part(h_ptr, hp_ptr, hs_ptr, shp_ptr, shs_ptr, ids_ptr, wts_ptr, sw_ptr, dw, ds, db, sdw, sds, sdb, t, slot,
              rn, n_mask, magic, stride_hr, stride_de, stride_dn, stride_dse, stride_dsn, stride_sdn, stride_sdsn,
              I: tl.constexpr, IS: tl.constexpr, TOPK: tl.constexpr, SLOTS: tl.constexpr, BN: tl.constexpr,
              BITS: tl.constexpr, GROUP: tl.constexpr, CG: tl.constexpr, S_BITS: tl.constexpr,
              S_GROUP: tl.constexpr, S_CG: tl.constexpr, INLINE: tl.constexpr, MUL_RN: tl.constexpr):
    """w_s * bf16(h . Wd[rn]) in fp32 [BN] for token t's slot (hbuf row t * SLOTS + slot): the down kernels' one
    block, the same instructions whether slot is a runtime value (_down_kernel) or a constexpr (the fused kernel).
    Slot < TOPK: the token's slot-th routed expert and its routing weight; slot TOPK: the shared expert and its
    gate's sigmoid."""
    r = t.to(tl.int64) * SLOTS + slot
    if slot < TOPK:
        e = tl.load(ids_ptr + t * TOPK + slot).to(tl.int64)
        y = gemv_row(h_ptr + r * stride_hr, hp_ptr + r * stride_hr, hs_ptr + r * (stride_hr // GROUP),
                     dw + e * stride_de, ds + e * stride_dse, db + e * stride_dse, rn, n_mask, stride_dn, stride_dsn,
                     magic, I, BITS, GROUP, BN, CG, INLINE)
        w_s = tl.load(wts_ptr + t * TOPK + slot)
    else:
        y = gemv_row(h_ptr + r * stride_hr, shp_ptr + r * stride_hr, shs_ptr + r * (stride_hr // S_GROUP),
                     sdw, sds, sdb, rn, n_mask, stride_sdn, stride_sdsn, magic, IS, S_BITS, S_GROUP, BN, S_CG, INLINE)
        w_s = tl.load(sw_ptr + t)
    return _mul_rn(w_s, y.to(tl.bfloat16).to(tl.float32), MUL_RN)


@triton.jit
def _slot_chunk(ids_ptr, dw, ds, db, sdw, sds, sdb, t, slot: tl.constexpr, rn64, n_mask, stride_de, stride_dn,
                stride_dse, stride_dsn, stride_sdn, stride_sdsn, TOPK: tl.constexpr, BN: tl.constexpr,
                BITS: tl.constexpr, GROUP: tl.constexpr, CG: tl.constexpr, S_BITS: tl.constexpr,
                S_GROUP: tl.constexpr, S_CG: tl.constexpr):
    """The down weight rows rn of token t's slot (a constexpr) as one load_chunk: the loads of slot_part's
    gemv_row when its K is one chunk."""
    if slot < TOPK:
        e = tl.load(ids_ptr + t * TOPK + slot).to(tl.int64)
        return load_chunk(dw + e * stride_de, ds + e * stride_dse, db + e * stride_dse, rn64, n_mask, stride_dn,
                          stride_dsn, 0, BITS, GROUP, BN, CG)
    else:
        return load_chunk(sdw, sds, sdb, rn64, n_mask, stride_sdn, stride_sdsn, 0, S_BITS, S_GROUP, BN, S_CG)


@triton.jit
def _slot_part_of(chunk, h_ptr, hp_ptr, hs_ptr, shp_ptr, shs_ptr, wts_ptr, sw_ptr, t, slot: tl.constexpr, magic,
                  stride_hr, I: tl.constexpr, IS: tl.constexpr, TOPK: tl.constexpr, SLOTS: tl.constexpr,
                  BN: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, CG: tl.constexpr,
                  S_BITS: tl.constexpr, S_GROUP: tl.constexpr, S_CG: tl.constexpr, INLINE: tl.constexpr,
                  MUL_RN: tl.constexpr):
    """slot_part from its _slot_chunk: gemv_row of a one-chunk K is chunk_dot from a zero accumulator, summed
    over the chunk's groups, so the same instructions on the same values (the same bits)."""
    r = t.to(tl.int64) * SLOTS + slot
    if slot < TOPK:
        a = tl.zeros((BN, CG) if BITS != 16 else (BN, CG * GROUP), dtype=tl.float32)
        y = tl.sum(chunk_dot(a, chunk, magic, h_ptr + r * stride_hr, hp_ptr + r * stride_hr,
                             hs_ptr + r * (stride_hr // GROUP), 0, I, BITS, GROUP, BN, CG, INLINE), axis=1)
        w_s = tl.load(wts_ptr + t * TOPK + slot)
    else:
        a = tl.zeros((BN, S_CG) if S_BITS != 16 else (BN, S_CG * S_GROUP), dtype=tl.float32)
        y = tl.sum(chunk_dot(a, chunk, magic, h_ptr + r * stride_hr, shp_ptr + r * stride_hr,
                             shs_ptr + r * (stride_hr // S_GROUP), 0, IS, S_BITS, S_GROUP, BN, S_CG, INLINE), axis=1)
        w_s = tl.load(sw_ptr + t)
    return _mul_rn(w_s, y.to(tl.bfloat16).to(tl.float32), MUL_RN)


@triton.jit
def combine_store(acc, res_ptr, out_ptr, t, rn, n_mask, stride_rt, stride_ot, HAS_RES: tl.constexpr):
    """out[t, rn] = bf16(acc) (the slots' fp32 sum), then bf16(float(residual) + float(that)) when HAS_RES: the
    combine's epilogue, shared by both MoE down paths."""
    o_ty = out_ptr.dtype.element_ty
    out = acc.to(o_ty)
    if HAS_RES:
        r = tl.load(res_ptr + t.to(tl.int64) * stride_rt + rn, mask=n_mask, other=0.0)
        out = (r.to(tl.float32) + out.to(tl.float32)).to(o_ty)
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + rn, out, mask=n_mask)


@triton.jit
def _gate_up_kernel(
    x_ptr, xp_ptr, xs_ptr, sxp_ptr, sxs_ptr, logit_ptr, ids_ptr, wts_ptr, h_ptr,
    gw, gs, gb, uw, us, ub, sgw, sgs, sgb, suw, sus, sub,
    E, I, IS, magic, stride_xt, stride_ht, stride_hs,
    stride_ge, stride_gn, stride_gse, stride_gsn, stride_ue, stride_un, stride_use, stride_usn,
    stride_sgn, stride_sgsn, stride_sun, stride_susn,
    H: tl.constexpr, TOPK: tl.constexpr, SLOTS: tl.constexpr, BN: tl.constexpr,
    BITS: tl.constexpr, GROUP: tl.constexpr, CG: tl.constexpr,
    S_BITS: tl.constexpr, S_GROUP: tl.constexpr, S_CG: tl.constexpr,
    EP: tl.constexpr = 1, NORMALIZE: tl.constexpr = True, FUSE_TOPK: tl.constexpr = False,
    INLINE: tl.constexpr = 0,
    PDL: tl.constexpr = False, LOOP: tl.constexpr = 1,
):
    # grid (T * SLOTS, cdiv(cdiv(max(I, IS), BN), LOOP)); slot < TOPK: the token's slot-th expert (ascending id),
    # slot TOPK: the shared expert; LOOP blocks of BN features per program (swiglu_blocks). INLINE
    # (triton_gemv_inline.inline_mode): gemv_row reads x raw (xp/xs unused).
    pdl_open(PDL)
    pdl_wait(PDL)
    pid = tl.program_id(0)
    t = pid // SLOTS
    slot = pid % SLOTS
    rn = tl.program_id(1) * (LOOP * BN) + tl.arange(0, BN)
    x_row = x_ptr + t.to(tl.int64) * stride_xt
    h_row = h_ptr + t.to(tl.int64) * stride_ht + slot * stride_hs
    if slot < TOPK:
        e = slot_expert(logit_ptr, ids_ptr, wts_ptr, t, slot, E, EP, TOPK, NORMALIZE, FUSE_TOPK)
        swiglu_blocks(x_row, xp_ptr + t.to(tl.int64) * H, xs_ptr + t.to(tl.int64) * (H // GROUP),
                      gw + e * stride_ge, gs + e * stride_gse, gb + e * stride_gse,
                      uw + e * stride_ue, us + e * stride_use, ub + e * stride_use, h_row, rn, I,
                      stride_gn, stride_gsn, stride_un, stride_usn, magic, H, BITS, GROUP, BN, CG, INLINE, LOOP)
    else:
        swiglu_blocks(x_row, sxp_ptr + t.to(tl.int64) * H, sxs_ptr + t.to(tl.int64) * (H // S_GROUP),
                      sgw, sgs, sgb, suw, sus, sub, h_row, rn, IS,
                      stride_sgn, stride_sgsn, stride_sun, stride_susn, magic, H, S_BITS, S_GROUP, BN, S_CG, INLINE,
                      LOOP)


@triton.jit
def _down_kernel(
    h_ptr, hp_ptr, hs_ptr, shp_ptr, shs_ptr, ids_ptr, wts_ptr, sw_ptr,
    dw, ds, db, sdw, sds, sdb,
    H, magic, stride_hr, stride_de, stride_dn, stride_dse, stride_dsn, stride_sdn, stride_sdsn, part_ptr,
    I: tl.constexpr, IS: tl.constexpr, TOPK: tl.constexpr, SLOTS: tl.constexpr, BN: tl.constexpr,
    BITS: tl.constexpr, GROUP: tl.constexpr, CG: tl.constexpr,
    S_BITS: tl.constexpr, S_GROUP: tl.constexpr, S_CG: tl.constexpr, INLINE: tl.constexpr = 0,
    MUL_RN: tl.constexpr = True, PDL: tl.constexpr = False,
):
    # grid (T * SLOTS, cdiv(H, BN)); row r = t * SLOTS + slot of hbuf (stride_hr) and of part [T*SLOTS, H]
    pdl_open(PDL)
    pdl_wait(PDL)
    r = tl.program_id(0)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = rn < H
    p = slot_part(h_ptr, hp_ptr, hs_ptr, shp_ptr, shs_ptr, ids_ptr, wts_ptr, sw_ptr, dw, ds, db, sdw, sds, sdb,
                  r // SLOTS, r % SLOTS, rn, n_mask, magic, stride_hr, stride_de, stride_dn, stride_dse, stride_dsn,
                  stride_sdn, stride_sdsn, I, IS, TOPK, SLOTS, BN, BITS, GROUP, CG, S_BITS, S_GROUP, S_CG, INLINE,
                  MUL_RN)
    tl.store(part_ptr + r.to(tl.int64) * H + rn, p, mask=n_mask)


@triton.jit
def _combine_kernel(part_ptr, res_ptr, out_ptr, H, stride_rt, stride_ot,
                    SLOTS: tl.constexpr, HAS_RES: tl.constexpr, BC: tl.constexpr, PDL: tl.constexpr = False):
    # grid (T, cdiv(H, BC)): slots summed in order 0 .. SLOTS-1 (ascending expert id, then the shared expert)
    pdl_open(PDL)
    pdl_wait(PDL)
    t = tl.program_id(0)
    rn = tl.program_id(1) * BC + tl.arange(0, BC)
    n_mask = rn < H
    base = part_ptr + t.to(tl.int64) * SLOTS * H + rn
    acc = tl.load(base, mask=n_mask, other=0.0)
    for s in tl.static_range(1, SLOTS):
        acc += tl.load(base + s * H, mask=n_mask, other=0.0)
    combine_store(acc, res_ptr, out_ptr, t, rn, n_mask, stride_rt, stride_ot, HAS_RES)


@triton.jit
def _down_combine_kernel(
    h_ptr, hp_ptr, hs_ptr, shp_ptr, shs_ptr, ids_ptr, wts_ptr, sw_ptr,
    dw, ds, db, sdw, sds, sdb,
    H, magic, stride_hr, stride_de, stride_dn, stride_dse, stride_dsn, stride_sdn, stride_sdsn,
    res_ptr, out_ptr, stride_rt, stride_ot,
    I: tl.constexpr, IS: tl.constexpr, TOPK: tl.constexpr, SLOTS: tl.constexpr, BN: tl.constexpr,
    BITS: tl.constexpr, GROUP: tl.constexpr, CG: tl.constexpr,
    S_BITS: tl.constexpr, S_GROUP: tl.constexpr, S_CG: tl.constexpr, HAS_RES: tl.constexpr,
    INLINE: tl.constexpr = 0, MUL_RN: tl.constexpr = True, PDL: tl.constexpr = False,
):
    # grid (T, cdiv(H, BN)): _down_kernel's SLOTS programs of token t and the combine of their features rn in one
    # program. Each slot's part is slot_part's (the same instructions), summed in the combine's order
    # (acc = part 0, then += part s for s = 1 .. SLOTS-1), then the combine's epilogue: the bits of the two launches.
    # One chunk per slot (K = I in one chunk, the default shapes): slots s+1 and s+2 are requested before slot s
    # is reduced, the loads pinned ahead by a barrier (ptxas sinks loads to their use: sm_90 SASS of the plain
    # slot loop had 2 of its 18 wide loads ahead of the first FMA, 29 vs 16.7 us per MoE block at T = 1).
    pdl_open(PDL)
    pdl_wait(PDL)
    t = tl.program_id(0)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = rn < H
    if I == CG * GROUP and IS == S_CG * S_GROUP:
        rn64 = rn.to(tl.int64)
        nxt1 = _slot_chunk(ids_ptr, dw, ds, db, sdw, sds, sdb, t, 0, rn64, n_mask, stride_de, stride_dn, stride_dse,
                           stride_dsn, stride_sdn, stride_sdsn, TOPK, BN, BITS, GROUP, CG, S_BITS, S_GROUP, S_CG)
        nxt2 = nxt1
        if SLOTS > 1:
            nxt2 = _slot_chunk(ids_ptr, dw, ds, db, sdw, sds, sdb, t, 1, rn64, n_mask, stride_de, stride_dn,
                               stride_dse, stride_dsn, stride_sdn, stride_sdsn, TOPK, BN, BITS, GROUP, CG, S_BITS,
                               S_GROUP, S_CG)
        acc = tl.zeros((BN,), dtype=tl.float32)
        for s in tl.static_range(SLOTS):
            cur = nxt1
            nxt1 = nxt2
            if s + 2 < SLOTS:
                nxt2 = _slot_chunk(ids_ptr, dw, ds, db, sdw, sds, sdb, t, s + 2, rn64, n_mask, stride_de, stride_dn,
                                   stride_dse, stride_dsn, stride_sdn, stride_sdsn, TOPK, BN, BITS, GROUP, CG, S_BITS,
                                   S_GROUP, S_CG)
                tl.debug_barrier()
            part = _slot_part_of(cur, h_ptr, hp_ptr, hs_ptr, shp_ptr, shs_ptr, wts_ptr, sw_ptr, t, s, magic,
                                 stride_hr, I, IS, TOPK, SLOTS, BN, BITS, GROUP, CG, S_BITS, S_GROUP, S_CG, INLINE,
                                 MUL_RN)
            if s == 0:
                acc = part  # the combine's order: part 0, then += part s
            else:
                acc += part
    else:
        acc = slot_part(h_ptr, hp_ptr, hs_ptr, shp_ptr, shs_ptr, ids_ptr, wts_ptr, sw_ptr, dw, ds, db, sdw, sds, sdb,
                        t, 0, rn, n_mask, magic, stride_hr, stride_de, stride_dn, stride_dse, stride_dsn, stride_sdn,
                        stride_sdsn, I, IS, TOPK, SLOTS, BN, BITS, GROUP, CG, S_BITS, S_GROUP, S_CG, INLINE, MUL_RN)
        for s in tl.static_range(1, SLOTS):
            acc += slot_part(h_ptr, hp_ptr, hs_ptr, shp_ptr, shs_ptr, ids_ptr, wts_ptr, sw_ptr, dw, ds, db, sdw, sds,
                             sdb, t, s, rn, n_mask, magic, stride_hr, stride_de, stride_dn, stride_dse, stride_dsn,
                             stride_sdn, stride_sdsn, I, IS, TOPK, SLOTS, BN, BITS, GROUP, CG, S_BITS, S_GROUP, S_CG,
                             INLINE, MUL_RN)
    combine_store(acc, res_ptr, out_ptr, t, rn, n_mask, stride_rt, stride_ot, HAS_RES)


def _prep(rows: torch.Tensor, spec: WeightSpec):
    """_prep_kernel output for a packed weight's input rows; dense weights read the bf16 rows (rows stand in)."""
    if spec.bits == DENSE_BITS:
        return rows, rows
    return prep_x(rows, spec.bits, spec.group)


def _group(spec: WeightSpec) -> int:
    return unit(spec)


def _routing(x, router, top_k, normalize, shared_gate, config, fuse_topk: bool, separate_topk: bool = False):
    """(routing, logits or None). fuse_topk: the router launch only (logits fp32 + the shared gate weight), ids
    and weights left for the gate/up kernel to write; else moe_route (the top-k inside the router launch, or in
    a launch of its own when separate_topk)."""
    if not fuse_topk:
        return moe_route(x, router, top_k, normalize, shared_gate, config, separate_topk), None
    config = {**DEFAULT_CONFIG, **(config or {})}
    r, gsp = _router_specs(x, router, top_k, shared_gate)
    logits, sw = _router_logits(x, r, gsp, shared_gate is not None, config)
    t = x.shape[0]
    ids = torch.empty(t, top_k, dtype=torch.int32, device=x.device)
    wts = torch.empty(t, top_k, dtype=torch.float32, device=x.device)
    return MoeRouting(ids, wts, sw), logits


def _launch_gate_up(x, routing, logits, hbuf, g, u, sg, su, top_k, slots, normalize, inline_prep, launch):
    t, h = x.shape
    i_r, i_s = g.n, (sg.n if slots > top_k else 0)
    if inline_prep:
        xp = xs = sxp = sxs = x  # unused
    else:
        xp, xs = _prep(x, g)
        sxp, sxs = _prep(x, sg) if (sg.bits, sg.group) != (g.bits, g.group) else (xp, xs)
    fuse = logits is not None
    e = logits.shape[1] if fuse else 1
    bn = launch.gate_up_bn
    cg, s_cg, warps = _gate_up_shape(g, sg, launch)
    loop = launch.gate_up_loop
    if loop > 1 and (DENSE_BITS in (g.bits, sg.bits) or cg * _group(g) != h or s_cg * _group(sg) != h):
        raise ValueError(f"moe_decode_v2: gate_up_loop {loop} needs packed gate/up weights read in one chunk per row "
                         f"(row runs), found CG {cg} / {s_cg} for H = {h}")
    _gate_up_kernel[(t * slots, triton.cdiv(triton.cdiv(hbuf.shape[2], bn), loop))](
        x, xp, xs, sxp, sxs, logits if fuse else x, routing.ids, routing.weights, hbuf,
        g.w, g.scales, g.biases, u.w, u.scales, u.biases, sg.w, sg.scales, sg.biases, su.w, su.scales, su.biases,
        e, i_r, i_s, MAGIC, x.stride(0), hbuf.stride(0), hbuf.stride(1),
        g.w.stride(0), g.w.stride(1), g.scales.stride(0), g.scales.stride(1),
        u.w.stride(0), u.w.stride(1), u.scales.stride(0), u.scales.stride(1),
        sg.w.stride(-2), sg.scales.stride(-2), su.w.stride(-2), su.scales.stride(-2),
        H=h, TOPK=top_k, SLOTS=slots, BN=bn, BITS=g.bits, GROUP=_group(g), CG=cg,
        S_BITS=sg.bits, S_GROUP=_group(sg), S_CG=s_cg, EP=triton.next_power_of_2(e),
        NORMALIZE=normalize, FUSE_TOPK=fuse, INLINE=inline_mode(x, inline_prep), LOOP=loop, num_warps=warps,
        **_regs(launch.gate_up_maxnreg), **pdl_args(x),
    )


def _launch_down(rows, routing, d, sd, top_k, slots, h, i_s, inline_prep, launch, part=None, combine=None):
    """The down projection of hbuf's rows [T * slots, width] in one of two launches (the same bits):
    part given: _down_kernel, grid (T * slots, cdiv(H, BN)), writing every (token, slot)'s weighted row into part
    [T * slots, H] fp32 for launch_combine; combine = (x, residual or None, out) instead: _down_combine_kernel, grid
    (T, cdiv(H, BN)), each program its token's slots in order, summed and written to out as launch_combine would."""
    if inline_prep:
        hp = hs = shp = shs = rows  # unused
    else:
        hp, hs = _prep_rows(rows, d)
        # the prep layout depends on the width read (its deinterleave pitch is K / PACK): a shared expert of
        # another format or intermediate size gets its own
        shared_like_routed = (sd.bits, sd.group, sd.k) == (d.bits, d.group, d.k)
        shp, shs = (hp, hs) if shared_like_routed else _prep_rows(rows, sd)
    bn = launch.down_bn
    args = (rows, hp, hs, shp, shs, routing.ids, routing.weights, routing.shared_weight,
            d.w, d.scales, d.biases, sd.w, sd.scales, sd.biases,
            h, MAGIC, rows.stride(0), d.w.stride(0), d.w.stride(1), d.scales.stride(0), d.scales.stride(1),
            sd.w.stride(-2), sd.scales.stride(-2))
    meta = dict(I=d.k, IS=i_s if slots > top_k else d.k, TOPK=top_k, SLOTS=slots, BN=bn,
                BITS=d.bits, GROUP=_group(d), CG=_cg(d, bn, launch.down_cg), S_BITS=sd.bits, S_GROUP=_group(sd),
                S_CG=_cg(sd, bn, launch.down_cg), INLINE=inline_mode(rows, inline_prep), MUL_RN=_mul_rn_asm(),
                num_warps=launch.down_warps, **_regs(launch.down_maxnreg))
    if combine is None:
        _down_kernel[(rows.shape[0], triton.cdiv(h, bn))](*args, part, **meta, **pdl_args(rows))
        return
    x, residual, out = combine
    res = residual if residual is not None else x
    _down_combine_kernel[(x.shape[0], triton.cdiv(h, bn))](
        *args, res, out, res.stride(0), out.stride(0), HAS_RES=residual is not None, **meta, **pdl_args(rows),
    )


def _mul_rn_asm() -> bool:
    """MUL_RN of the down kernels (_mul_rn): the PTX multiply, except in Triton's interpreter. TRITON_INTERPRET is
    read here, not backend.interpreting(), which the compile-only scripts (scripts/sass_report.py) force on."""
    return os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def _regs(maxnreg: int | None) -> dict:
    """Launch kwargs capping registers per thread: more resident programs per SM (the H200 ncu of the gate/up
    kernel: 166 registers, 3 programs of 4 warps per SM, 1.45 waves for T = 1)."""
    return {} if maxnreg is None else {"maxnreg": maxnreg}


def moe_decode_v2(
    x: torch.Tensor, router, gate, up, down, top_k: int, *, normalize: bool = True,
    shared_gate_proj=None, shared_up=None, shared_down=None, shared_gate=None,
    residual: torch.Tensor | None = None, return_routing: bool = False, out: torch.Tensor | None = None,
    config: dict | None = None, inline_prep: bool = True, fuse_topk: bool = False, launch: MoeLaunch | None = None,
    separate_topk: bool = False,
):
    """The MoE block for T tokens x [T, H] (bf16); arguments and result as `triton_decode.moe_decode`
    (config is passed to the router launch). Launches: router (the top-k at each token's last-arriving router
    program), gate/up, down+combine (3) by default; fuse_topk=True recomputes the top-k at the head of every
    gate/up program instead, separate_topk=True gives it a launch of its own, inline_prep=False adds the prep
    launches of x and of hbuf
    (the v2 path, kept so the two can be timed against each other). launch: the kernels' launch shape (MoeLaunch;
    None: the defaults and env switches, _env_launch), for sweeps (scripts/sweep_decode_kernels.py);
    launch.fuse_down_combine=False: down and combine as two launches (4 by default), the same bits."""
    launch = _env_launch() if launch is None else launch
    t, h = x.shape
    g, u, d, sg, su, sd, has_shared = expert_specs(
        x, router, gate, up, down, shared_gate_proj, shared_up, shared_down, shared_gate, residual
    )
    routing, logits = _routing(x, router, top_k, normalize, shared_gate, config, fuse_topk, separate_topk)
    out = torch.empty_like(x) if out is None else out
    if t == 0:
        return (out, routing) if return_routing else out
    i_s, slots, hbuf = slot_buffers(x, g, sg, has_shared, top_k)
    _launch_gate_up(x, routing, logits, hbuf, g, u, sg, su, top_k, slots, normalize, inline_prep, launch)
    rows = hbuf.view(t * slots, hbuf.shape[2])
    if launch.fuse_down_combine:
        _launch_down(rows, routing, d, sd, top_k, slots, h, i_s, inline_prep, launch, combine=(x, residual, out))
    else:
        part = torch.empty(t * slots, h, dtype=torch.float32, device=x.device)
        _launch_down(rows, routing, d, sd, top_k, slots, h, i_s, inline_prep, launch, part=part)
        launch_combine(part, x, residual, out, slots, launch)
    return (out, routing) if return_routing else out


def expert_specs(x, router, gate, up, down, shared_gate_proj, shared_up, shared_down, shared_gate, residual):
    """moe_weight_specs, with the routed experts checked to be stacked [E, ..] like the router."""
    specs = moe_weight_specs(x, gate, up, down, shared_gate_proj, shared_up, shared_down, shared_gate, residual)
    g = specs[0]
    if g.w.dim() != 3 or g.w.shape[0] != routing_experts(router):
        raise ValueError(f"moe experts: gate/up/down must be stacked [E, ..] like the router, found "
                         f"{tuple(g.w.shape)}")
    return specs


def slot_buffers(x, g: WeightSpec, sg: WeightSpec, has_shared: bool, top_k: int):
    """(shared I or 0, slots per token, hbuf [T, slots, max I] bf16): the SwiGLU rows of every (token, slot), the
    routed picks first, the shared expert last."""
    t = x.shape[0]
    i_s = sg.n if has_shared else 0
    slots = top_k + int(has_shared)
    hbuf = torch.empty(t, slots, max(g.n, i_s), dtype=torch.bfloat16, device=x.device)
    return i_s, slots, hbuf


def launch_combine(part, x, residual, out, slots: int, launch: MoeLaunch) -> None:
    """out = bf16(sum of each token's slots in order) (+ residual, rounded once more): _combine_kernel."""
    t, h = x.shape
    res = residual if residual is not None else x
    bc = launch.combine_bc
    _combine_kernel[(t, triton.cdiv(h, bc))](
        part, res, out, h, res.stride(0), out.stride(0), SLOTS=slots, HAS_RES=residual is not None, BC=bc,
        num_warps=launch.combine_warps, **pdl_args(part),
    )


def routing_experts(router) -> int:
    return _spec(router, "router").n


def _prep_rows(rows: torch.Tensor, spec: WeightSpec):
    """Prep of hbuf rows [R, width] for a down weight reading the first spec.k features, with hbuf's row pitch
    (so the down kernel addresses the routed and the shared slots' rows with one stride)."""
    if spec.bits == DENSE_BITS:
        return rows, rows
    return prep_x(rows, spec.bits, spec.group, spec.k)

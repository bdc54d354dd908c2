"""MoE block for decode (T <= ~16 tokens), restructured for parallelism on top of the decode GEMV
(`kernels/quant/triton_gemv.py`). Same signature and meaning as `kernels/moe/triton_decode.py::moe_decode`:

  routing      moe_route (router logits fp32 + the routing contract: top-k, ties to the lower id, ids ascending)
  gate/up      grid (T * SLOTS, cdiv(I, BN)): slot s < k is the token's s-th picked expert, slot k the shared one;
               h = bf16(bf16(SiLU(bf16 g)) * bf16 u) into hbuf [T, SLOTS, I]
  down         grid (T * SLOTS, cdiv(H, BN)): part[t, s] = w_s * bf16(h_s Wd_s^T) in fp32 (w = shared gate
               sigmoid for the shared slot)
  combine      grid (T, cdiv(H, BC)): out = bf16(sum over s = 0..SLOTS-1 of part[t, s]), in that fixed order
               (ascending expert id, then shared), + residual: bf16(r + out)

Many small programs (BN = 8 features, the full K each) instead of a few long ones. Every GEMV row is computed by
`gemv_row`, whose arithmetic depends on the weight format and shape only, and every reduction has one fixed order,
so a token's output never depends on the other tokens of the launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant.triton_gemv import MAGIC, chunk_groups, gemv_row, prep_x, unit
from ..triton_common import DENSE_BITS, WeightSpec
from .triton_decode import MoeRouting, _silu_mul_bf16, _spec, moe_route, moe_weight_specs

BN = 8  # features per program (gate/up: of I; down: of H)
BC = 256  # features per combine program


@triton.jit
def _gate_up_kernel(
    x_ptr, xp_ptr, xs_ptr, sxp_ptr, sxs_ptr, ids_ptr, h_ptr,
    gw, gs, gb, uw, us, ub, sgw, sgs, sgb, suw, sus, sub,
    I, IS, magic, stride_xt, stride_ht, stride_hs,
    stride_ge, stride_gn, stride_gse, stride_gsn, stride_ue, stride_un, stride_use, stride_usn,
    stride_sgn, stride_sgsn, stride_sun, stride_susn,
    H: tl.constexpr, TOPK: tl.constexpr, SLOTS: tl.constexpr, BN: tl.constexpr,
    BITS: tl.constexpr, GROUP: tl.constexpr, CG: tl.constexpr,
    S_BITS: tl.constexpr, S_GROUP: tl.constexpr, S_CG: tl.constexpr,
):
    pid = tl.program_id(0)
    t = pid // SLOTS
    slot = pid % SLOTS
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    x_row = x_ptr + t.to(tl.int64) * stride_xt
    h_row = h_ptr + t.to(tl.int64) * stride_ht + slot * stride_hs
    if slot < TOPK:
        e = tl.load(ids_ptr + t * TOPK + slot).to(tl.int64)
        n_mask = rn < I
        xp_row = xp_ptr + t.to(tl.int64) * H
        xs_row = xs_ptr + t.to(tl.int64) * (H // GROUP)
        g = gemv_row(x_row, xp_row, xs_row, gw + e * stride_ge, gs + e * stride_gse, gb + e * stride_gse, rn, n_mask,
                     stride_gn, stride_gsn, magic, H, BITS, GROUP, BN, CG)
        u = gemv_row(x_row, xp_row, xs_row, uw + e * stride_ue, us + e * stride_use, ub + e * stride_use, rn, n_mask,
                     stride_un, stride_usn, magic, H, BITS, GROUP, BN, CG)
        tl.store(h_row + rn, _silu_mul_bf16(g, u), mask=n_mask)
    else:
        n_mask = rn < IS
        xp_row = sxp_ptr + t.to(tl.int64) * H
        xs_row = sxs_ptr + t.to(tl.int64) * (H // S_GROUP)
        g = gemv_row(x_row, xp_row, xs_row, sgw, sgs, sgb, rn, n_mask, stride_sgn, stride_sgsn, magic,
                     H, S_BITS, S_GROUP, BN, S_CG)
        u = gemv_row(x_row, xp_row, xs_row, suw, sus, sub, rn, n_mask, stride_sun, stride_susn, magic,
                     H, S_BITS, S_GROUP, BN, S_CG)
        tl.store(h_row + rn, _silu_mul_bf16(g, u), mask=n_mask)


@triton.jit
def _down_kernel(
    h_ptr, hp_ptr, hs_ptr, shp_ptr, shs_ptr, ids_ptr, wts_ptr, sw_ptr, part_ptr,
    dw, ds, db, sdw, sds, sdb,
    H, magic, stride_hr, stride_de, stride_dn, stride_dse, stride_dsn, stride_sdn, stride_sdsn,
    I: tl.constexpr, IS: tl.constexpr, TOPK: tl.constexpr, SLOTS: tl.constexpr, BN: tl.constexpr,
    BITS: tl.constexpr, GROUP: tl.constexpr, CG: tl.constexpr,
    S_BITS: tl.constexpr, S_GROUP: tl.constexpr, S_CG: tl.constexpr,
):
    # grid (T * SLOTS, cdiv(H, BN)); row r = t * SLOTS + slot of hbuf (stride_hr) and of part [T*SLOTS, H]
    r = tl.program_id(0)
    t = r // SLOTS
    slot = r % SLOTS
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = rn < H
    h_row = h_ptr + r.to(tl.int64) * stride_hr
    if slot < TOPK:
        e = tl.load(ids_ptr + t * TOPK + slot).to(tl.int64)
        w_s = tl.load(wts_ptr + t * TOPK + slot)
        y = gemv_row(h_row, hp_ptr + r.to(tl.int64) * stride_hr, hs_ptr + r.to(tl.int64) * (stride_hr // GROUP),
                     dw + e * stride_de, ds + e * stride_dse, db + e * stride_dse, rn, n_mask, stride_dn, stride_dsn,
                     magic, I, BITS, GROUP, BN, CG)
    else:
        w_s = tl.load(sw_ptr + t)
        y = gemv_row(h_row, shp_ptr + r.to(tl.int64) * stride_hr, shs_ptr + r.to(tl.int64) * (stride_hr // S_GROUP),
                     sdw, sds, sdb, rn, n_mask, stride_sdn, stride_sdsn, magic, IS, S_BITS, S_GROUP, BN, S_CG)
    tl.store(part_ptr + r.to(tl.int64) * H + rn, w_s * y.to(tl.bfloat16).to(tl.float32), mask=n_mask)


@triton.jit
def _combine_kernel(part_ptr, res_ptr, out_ptr, H, stride_rt, stride_ot,
                    SLOTS: tl.constexpr, HAS_RES: tl.constexpr, BC: tl.constexpr):
    # grid (T, cdiv(H, BC)): slots summed in order 0 .. SLOTS-1 (ascending expert id, then the shared expert)
    t = tl.program_id(0)
    rn = tl.program_id(1) * BC + tl.arange(0, BC)
    n_mask = rn < H
    base = part_ptr + t.to(tl.int64) * SLOTS * H + rn
    acc = tl.load(base, mask=n_mask, other=0.0)
    for s in tl.static_range(1, SLOTS):
        acc += tl.load(base + s * H, mask=n_mask, other=0.0)
    o_ty = out_ptr.dtype.element_ty
    out = acc.to(o_ty)
    if HAS_RES:
        r = tl.load(res_ptr + t.to(tl.int64) * stride_rt + rn, mask=n_mask, other=0.0)
        out = (r.to(tl.float32) + out.to(tl.float32)).to(o_ty)
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + rn, out, mask=n_mask)


def _prep(rows: torch.Tensor, spec: WeightSpec):
    """_prep_kernel output for a packed weight's input rows; dense weights read the bf16 rows (rows stand in)."""
    if spec.bits == DENSE_BITS:
        return rows, rows
    return prep_x(rows, spec.bits, spec.group)


def _group(spec: WeightSpec) -> int:
    return unit(spec)


def moe_decode_v2(
    x: torch.Tensor, router, gate, up, down, top_k: int, *, normalize: bool = True,
    shared_gate_proj=None, shared_up=None, shared_down=None, shared_gate=None,
    residual: torch.Tensor | None = None, return_routing: bool = False, out: torch.Tensor | None = None,
    config: dict | None = None,
):
    """The MoE block for T tokens x [T, H] (bf16); arguments and result as `triton_decode.moe_decode`
    (config is passed to moe_route for the router launch)."""
    t, h = x.shape
    g, u, d, sg, su, sd, has_shared = moe_weight_specs(
        x, gate, up, down, shared_gate_proj, shared_up, shared_down, shared_gate, residual
    )
    routing = moe_route(x, router, top_k, normalize, shared_gate, config)
    if g.w.dim() != 3 or g.w.shape[0] != routing_experts(router):
        raise ValueError(f"moe experts: gate/up/down must be stacked [E, ..] like the router, found "
                         f"{tuple(g.w.shape)}")
    out = torch.empty_like(x) if out is None else out
    if t == 0:
        return (out, routing) if return_routing else out
    i_r, i_s = g.n, (sg.n if has_shared else 0)
    slots = top_k + int(has_shared)
    width = max(i_r, i_s)
    xp, xs = _prep(x, g)
    sxp, sxs = _prep(x, sg) if (sg.bits, sg.group) != (g.bits, g.group) else (xp, xs)
    hbuf = torch.empty(t, slots, width, dtype=torch.bfloat16, device=x.device)
    _gate_up_kernel[(t * slots, triton.cdiv(width, BN))](
        x, xp, xs, sxp, sxs, routing.ids, hbuf, g.w, g.scales, g.biases, u.w, u.scales, u.biases,
        sg.w, sg.scales, sg.biases, su.w, su.scales, su.biases,
        i_r, i_s, MAGIC, x.stride(0), hbuf.stride(0), hbuf.stride(1),
        g.w.stride(0), g.w.stride(1), g.scales.stride(0), g.scales.stride(1),
        u.w.stride(0), u.w.stride(1), u.scales.stride(0), u.scales.stride(1),
        sg.w.stride(-2), sg.scales.stride(-2), su.w.stride(-2), su.scales.stride(-2),
        H=h, TOPK=top_k, SLOTS=slots, BN=BN, BITS=g.bits, GROUP=_group(g), CG=chunk_groups(g, BN),
        S_BITS=sg.bits, S_GROUP=_group(sg), S_CG=chunk_groups(sg, BN), num_warps=4,
    )
    rows = hbuf.view(t * slots, width)
    hp, hs = _prep_rows(rows, d)
    shp, shs = _prep_rows(rows, sd) if (sd.bits, sd.group) != (d.bits, d.group) else (hp, hs)
    part = torch.empty(t * slots, h, dtype=torch.float32, device=x.device)
    _down_kernel[(t * slots, triton.cdiv(h, BN))](
        rows, hp, hs, shp, shs, routing.ids, routing.weights, routing.shared_weight, part,
        d.w, d.scales, d.biases, sd.w, sd.scales, sd.biases,
        h, MAGIC, rows.stride(0), d.w.stride(0), d.w.stride(1), d.scales.stride(0), d.scales.stride(1),
        sd.w.stride(-2), sd.scales.stride(-2),
        I=i_r, IS=i_s if has_shared else i_r, TOPK=top_k, SLOTS=slots, BN=BN,
        BITS=d.bits, GROUP=_group(d), CG=chunk_groups(d, BN), S_BITS=sd.bits, S_GROUP=_group(sd),
        S_CG=chunk_groups(sd, BN), num_warps=4,
    )
    res = residual if residual is not None else x
    _combine_kernel[(t, triton.cdiv(h, BC))](
        part, res, out, h, res.stride(0), out.stride(0), SLOTS=slots, HAS_RES=residual is not None, BC=BC,
        num_warps=4,
    )
    return (out, routing) if return_routing else out


def routing_experts(router) -> int:
    return _spec(router, "router").n


def _prep_rows(rows: torch.Tensor, spec: WeightSpec):
    """Prep of hbuf rows [R, width] for a down weight reading the first spec.k features, with hbuf's row pitch
    (so the down kernel addresses the routed and the shared slots' rows with one stride)."""
    if spec.bits == DENSE_BITS:
        return rows, rows
    return prep_x(rows, spec.bits, spec.group, spec.k)

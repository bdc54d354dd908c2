"""MoE block for decode (T <= ~16 tokens), restructured for parallelism on top of the decode GEMV
(`kernels/quant/triton_gemv.py`). Same signature and meaning as `kernels/moe/triton_decode.py::moe_decode`:

  router       router logits fp32 [T, E] and the shared gate's sigmoid (triton_decode._router_kernel)
  gate/up      grid (T * SLOTS, cdiv(I, BN)): slot s < k is the token's s-th picked expert, slot k the shared one;
               each routed program applies the routing contract (top-k, ties to the lower id, ids ascending) to
               its token's logits itself, column block 0 publishes ids/weights (no top-k launch);
               h = bf16(bf16(SiLU(bf16 g)) * bf16 u) into hbuf [T, SLOTS, I]
  down         grid (T * SLOTS, cdiv(H, BN)): part[t, s] = w_s * bf16(h_s Wd_s^T) in fp32 (w = shared gate
               sigmoid for the shared slot)
  combine      grid (T, cdiv(H, BC)): out = bf16(sum over s = 0..SLOTS-1 of part[t, s]), in that fixed order
               (ascending expert id, then shared), + residual: bf16(r + out)

Four launches, none for preparing x: every GEMV reads its bf16 rows raw (gemv_row's INLINE; inline_prep=False
restores the prep launches for timing). Many small programs (BN features, the full K each: launch_table
"moe_gemv.gate_up_bn" / "moe_gemv.bn") instead of a few long ones. Every GEMV row is computed by
`gemv_row`, whose arithmetic depends on the weight format and shape only, and every reduction has one fixed order,
so a token's output never depends on the other tokens of the launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..launch_table import value as launch_value
from ..quant.triton_gemv import MAGIC, chunk_groups, gemv_row, gemv_row_pair, prep_x, row_run_config, unit
from ..quant.triton_gemv_inline import inline_mode
from ..triton_common import DENSE_BITS, WeightSpec
from ..triton_pdl import pdl_args, pdl_enabled, pdl_open, pdl_wait
from .triton_decode import _silu_mul_bf16, _spec, moe_route, moe_weight_specs

# MoeLaunch's fields whose default (None) is the launch table's tuned value, read when a MoeLaunch is made
_TUNED = {"gate_up_bn": "moe_gemv.gate_up_bn", "gate_up_warps": "moe_gemv.gate_up_warps", "down_bn": "moe_gemv.bn",
          "down_warps": "moe_gemv.down_warps", "combine_bc": "moe_gemv.bc", "combine_warps": "moe_gemv.combine_warps"}


@dataclass(frozen=True)
class MoeLaunch:
    """Launch shape of moe_decode_v2's gate/up, down and combine kernels. A tuned field left None (bn, warps, bc:
    _TUNED) takes the launch table's value ("moe_gemv.gate_up_bn", "moe_gemv.bn", "moe_gemv.down_warps", ...) when
    the MoeLaunch is made, so MoeLaunch() is the tuned launch and a sweep's MoeLaunch(down_warps=4) changes that
    field alone. bn: features per program; cg: groups per
    K chunk (None: chunk_groups(weight, bn), i.e. it shrinks as bn grows; an int holds a weight's chunking, and so
    its per-row summation order, fixed while bn changes); bc: features per combine program. Every field is fixed
    per call and none depends on T, so a token's arithmetic never depends on the other tokens of the launch."""

    gate_up_bn: int | None = None
    gate_up_warps: int | None = None
    gate_up_cg: int | None = None
    gate_up_row_run: bool = True  # CG and warps from triton_gemv.row_run_config (gate_up_cg/_warps unused then)
    down_bn: int | None = None
    down_warps: int | None = None
    down_cg: int | None = None
    combine_bc: int | None = None
    combine_warps: int | None = None
    gate_up_maxnreg: int | None = None  # register cap per thread (Triton's maxnreg), None: the compiler's choice
    down_maxnreg: int | None = None

    def __post_init__(self):
        for name, entry in _TUNED.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, launch_value(entry))
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
def down_block(h_row, hp_row, hs_row, dw, ds, db, w_s, part_row, rn, n_mask, stride_dn, stride_dsn, magic,
               K: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr,
               INLINE: tl.constexpr, PDL_WAIT: tl.constexpr = False):
    """part[rn] = w_s * bf16(h . Wd[rn]) in fp32 for one (token, slot) row: the down kernels' one block.
    PDL_WAIT: the caller has not waited yet: gemv_row waits once the weight's first chunks are requested."""
    y = gemv_row(h_row, hp_row, hs_row, dw, ds, db, rn, n_mask, stride_dn, stride_dsn, magic, K, BITS, GROUP, BN, CG,
                 INLINE, PDL_WAIT)
    tl.store(part_row + rn, w_s * y.to(tl.bfloat16).to(tl.float32), mask=n_mask)


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
    INLINE: tl.constexpr = 0,
    PDL: tl.constexpr = False, OPEN_LATE: tl.constexpr = False,
):
    # grid (T * SLOTS, cdiv(max(I, IS), BN)); slot < TOPK: the token's slot-th expert (ascending id), slot TOPK:
    # the shared expert. INLINE (triton_gemv_inline.inline_mode): gemv_row reads x raw (xp/xs unused).
    # OPEN_LATE: the next launch (down) may start only once every program here has passed its wait, i.e. once
    # the routing (ids, weights) is complete: down's early form reads it before its own wait (down_early)
    if not OPEN_LATE:
        pdl_open(PDL)
    pdl_wait(PDL)
    if OPEN_LATE:
        pdl_open(PDL)
    pid = tl.program_id(0)
    t = pid // SLOTS
    slot = pid % SLOTS
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    x_row = x_ptr + t.to(tl.int64) * stride_xt
    h_row = h_ptr + t.to(tl.int64) * stride_ht + slot * stride_hs
    if slot < TOPK:
        e = tl.load(ids_ptr + t * TOPK + slot).to(tl.int64)  # the routing's slot-th expert (ascending id)
        swiglu_block(x_row, xp_ptr + t.to(tl.int64) * H, xs_ptr + t.to(tl.int64) * (H // GROUP),
                     gw + e * stride_ge, gs + e * stride_gse, gb + e * stride_gse,
                     uw + e * stride_ue, us + e * stride_use, ub + e * stride_use, h_row, rn, rn < I,
                     stride_gn, stride_gsn, stride_un, stride_usn, magic, H, BITS, GROUP, BN, CG, INLINE)
    else:
        swiglu_block(x_row, sxp_ptr + t.to(tl.int64) * H, sxs_ptr + t.to(tl.int64) * (H // S_GROUP),
                     sgw, sgs, sgb, suw, sus, sub, h_row, rn, rn < IS,
                     stride_sgn, stride_sgsn, stride_sun, stride_susn, magic, H, S_BITS, S_GROUP, BN, S_CG, INLINE)


@triton.jit
def _down_kernel(
    h_ptr, hp_ptr, hs_ptr, shp_ptr, shs_ptr, ids_ptr, wts_ptr, sw_ptr, part_ptr,
    dw, ds, db, sdw, sds, sdb,
    H, magic, stride_hr, stride_de, stride_dn, stride_dse, stride_dsn, stride_sdn, stride_sdsn,
    I: tl.constexpr, IS: tl.constexpr, TOPK: tl.constexpr, SLOTS: tl.constexpr, BN: tl.constexpr,
    BITS: tl.constexpr, GROUP: tl.constexpr, CG: tl.constexpr,
    S_BITS: tl.constexpr, S_GROUP: tl.constexpr, S_CG: tl.constexpr, INLINE: tl.constexpr = 0,
    PDL: tl.constexpr = False, EARLY: tl.constexpr = False,
):
    # grid (T * SLOTS, cdiv(H, BN)); row r = t * SLOTS + slot of hbuf (stride_hr) and of part [T*SLOTS, H].
    # EARLY (down_early; the gate/up launch before this one opened late): the routing (expert id, weight, shared
    # gate) and the picked expert's first weight chunks are read before the PDL wait, hbuf after it. Safe because
    # this launch started only after every gate/up program had passed its wait, so the kernel that wrote the
    # routing has completed; read from L2 (".cg"), never from a line an earlier kernel left in this SM's L1.
    # The same loads and arithmetic as the late form: the same bits.
    pdl_open(PDL)
    if not EARLY:
        pdl_wait(PDL)
    r = tl.program_id(0)
    t = r // SLOTS
    slot = r % SLOTS
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = rn < H
    h_row = h_ptr + r.to(tl.int64) * stride_hr
    part_row = part_ptr + r.to(tl.int64) * H
    ROUTING_CACHE: tl.constexpr = ".cg" if EARLY else ""  # early: the routing from L2, not from this SM's L1
    if slot < TOPK:
        e = tl.load(ids_ptr + t * TOPK + slot, cache_modifier=ROUTING_CACHE).to(tl.int64)
        down_block(h_row, hp_ptr + r.to(tl.int64) * stride_hr, hs_ptr + r.to(tl.int64) * (stride_hr // GROUP),
                   dw + e * stride_de, ds + e * stride_dse, db + e * stride_dse,
                   tl.load(wts_ptr + t * TOPK + slot, cache_modifier=ROUTING_CACHE),
                   part_row, rn, n_mask, stride_dn, stride_dsn, magic, I, BITS, GROUP, BN, CG, INLINE, EARLY and PDL)
    else:
        down_block(h_row, shp_ptr + r.to(tl.int64) * stride_hr, shs_ptr + r.to(tl.int64) * (stride_hr // S_GROUP),
                   sdw, sds, sdb, tl.load(sw_ptr + t, cache_modifier=ROUTING_CACHE), part_row, rn, n_mask, stride_sdn,
                   stride_sdsn, magic, IS, S_BITS, S_GROUP, BN, S_CG, INLINE, EARLY and PDL)


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


def down_early(x: torch.Tensor, tensor_cores: bool = False) -> bool:
    """Whether the decode MoE's down launch reads the routing and requests its experts' weights before its PDL
    wait (the gate/up launch before it then lets it start only after every gate/up program has waited: the
    routing is complete by then): the tensor-core MoE's, with PDL (without it the launches are serialised anyway).
    Same bits either way. H200, tg128 @ d512 B=1 (lab/NOTES.md): the tensor-core MoE 637.8 -> 643.3 tok/s with it;
    the CUDA-core one 652.5 / 653.7 -> 650.6 / 650.1 (its gate/up loses what down gains: its weights' early loads
    ride on gate/up's time), so the CUDA-core MoE keeps it off."""
    return tensor_cores and pdl_enabled(x)


def _launch_gate_up(x, routing, hbuf, g, u, sg, su, top_k, slots, inline_prep, launch, open_late=False):
    t, h = x.shape
    i_r, i_s = g.n, (sg.n if slots > top_k else 0)
    if inline_prep:
        xp = xs = sxp = sxs = x  # unused
    else:
        xp, xs = _prep(x, g)
        sxp, sxs = _prep(x, sg) if (sg.bits, sg.group) != (g.bits, g.group) else (xp, xs)
    bn = launch.gate_up_bn
    cg, s_cg, warps = _gate_up_shape(g, sg, launch)
    _gate_up_kernel[(t * slots, triton.cdiv(hbuf.shape[2], bn))](
        x, xp, xs, sxp, sxs, routing.ids, hbuf,
        g.w, g.scales, g.biases, u.w, u.scales, u.biases, sg.w, sg.scales, sg.biases, su.w, su.scales, su.biases,
        i_r, i_s, MAGIC, x.stride(0), hbuf.stride(0), hbuf.stride(1),
        g.w.stride(0), g.w.stride(1), g.scales.stride(0), g.scales.stride(1),
        u.w.stride(0), u.w.stride(1), u.scales.stride(0), u.scales.stride(1),
        sg.w.stride(-2), sg.scales.stride(-2), su.w.stride(-2), su.scales.stride(-2),
        H=h, TOPK=top_k, SLOTS=slots, BN=bn, BITS=g.bits, GROUP=_group(g), CG=cg,
        S_BITS=sg.bits, S_GROUP=_group(sg), S_CG=s_cg, INLINE=inline_mode(x, inline_prep), num_warps=warps,
        **_regs(launch.gate_up_maxnreg), **pdl_args(x), **({"OPEN_LATE": True} if open_late else {}),
    )


def _launch_down(rows, routing, part, d, sd, top_k, slots, h, i_s, inline_prep, launch, early=False):
    if inline_prep:
        hp = hs = shp = shs = rows  # unused
    else:
        hp, hs = _prep_rows(rows, d)
        # the prep layout depends on the width read (its deinterleave pitch is K / PACK): a shared expert of
        # another format or intermediate size gets its own
        shared_like_routed = (sd.bits, sd.group, sd.k) == (d.bits, d.group, d.k)
        shp, shs = (hp, hs) if shared_like_routed else _prep_rows(rows, sd)
    bn = launch.down_bn
    _down_kernel[(rows.shape[0], triton.cdiv(h, bn))](
        rows, hp, hs, shp, shs, routing.ids, routing.weights, routing.shared_weight, part,
        d.w, d.scales, d.biases, sd.w, sd.scales, sd.biases,
        h, MAGIC, rows.stride(0), d.w.stride(0), d.w.stride(1), d.scales.stride(0), d.scales.stride(1),
        sd.w.stride(-2), sd.scales.stride(-2),
        I=d.k, IS=i_s if slots > top_k else d.k, TOPK=top_k, SLOTS=slots, BN=bn,
        BITS=d.bits, GROUP=_group(d), CG=_cg(d, bn, launch.down_cg), S_BITS=sd.bits, S_GROUP=_group(sd),
        S_CG=_cg(sd, bn, launch.down_cg), INLINE=inline_mode(rows, inline_prep), num_warps=launch.down_warps,
        **_regs(launch.down_maxnreg), **pdl_args(rows), **({"EARLY": True} if early else {}),
    )


def _regs(maxnreg: int | None) -> dict:
    """Launch kwargs capping registers per thread: more resident programs per SM (the H200 ncu of the gate/up
    kernel: 166 registers, 3 programs of 4 warps per SM, 1.45 waves for T = 1)."""
    return {} if maxnreg is None else {"maxnreg": maxnreg}


def moe_decode_v2(
    x: torch.Tensor, router, gate, up, down, top_k: int, *, normalize: bool = True,
    shared_gate_proj=None, shared_up=None, shared_down=None, shared_gate=None,
    residual: torch.Tensor | None = None, return_routing: bool = False, out: torch.Tensor | None = None,
    config: dict | None = None, inline_prep: bool = True, launch: MoeLaunch | None = None,
    separate_topk: bool = False,
):
    """The MoE block for T tokens x [T, H] (bf16); arguments and result as `triton_decode.moe_decode`
    (config is passed to the router launch). Launches: router (the top-k at each token's last-arriving router
    program), gate/up, down, combine (4) by default; separate_topk=True gives the top-k a launch of its own (the
    model's form), inline_prep=False adds the prep launches of x and of hbuf
    (the v2 path, kept so the two can be timed against each other). launch: the kernels' launch shape (MoeLaunch;
    None: MoeLaunch(), the launch table's tuned shape), for sweeps (lab/sweep_decode_kernels.py)."""
    launch = MoeLaunch() if launch is None else launch
    t, h = x.shape
    g, u, d, sg, su, sd, has_shared = expert_specs(
        x, router, gate, up, down, shared_gate_proj, shared_up, shared_down, shared_gate, residual
    )
    routing = moe_route(x, router, top_k, normalize, shared_gate, config, separate_topk)
    out = torch.empty_like(x) if out is None else out
    if t == 0:
        return (out, routing) if return_routing else out
    i_s, slots, hbuf, part = slot_buffers(x, g, sg, has_shared, top_k)
    early = down_early(x)  # the early down reads the routing before its wait
    _launch_gate_up(x, routing, hbuf, g, u, sg, su, top_k, slots, inline_prep, launch, early)
    rows = hbuf.view(t * slots, hbuf.shape[2])
    _launch_down(rows, routing, part, d, sd, top_k, slots, h, i_s, inline_prep, launch, early)
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
    """(shared I or 0, slots per token, hbuf [T, slots, max I] bf16, part [T * slots, H] fp32): the SwiGLU rows and
    the weighted down outputs of every (token, slot), the routed picks first, the shared expert last."""
    t, h = x.shape
    i_s = sg.n if has_shared else 0
    slots = top_k + int(has_shared)
    hbuf = torch.empty(t, slots, max(g.n, i_s), dtype=torch.bfloat16, device=x.device)
    part = torch.empty(t * slots, h, dtype=torch.float32, device=x.device)
    return i_s, slots, hbuf, part


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

"""Expert-major MoE decode: the same block, the same bits as `triton_moe_gemv.moe_decode_v2`, with every picked
expert's weights read once per launch instead of once per token that picked it.

moe_decode_v2 runs one program per (token, slot) and block of features: at T = 64 tokens x 9 slots that is ~576
expert slices per layer read from L2/DRAM for ~200 distinct experts (H200, 64 streams: 945 tok/s aggregate). Here:

  lists        one program: the T*k picks sorted by (expert, pick) (a (T*k)-wide tl.sort of unique keys), the
               distinct experts in ascending order (`active`), their first pick and count
  gate/up      grid (min(E, T*k) + 1, cdiv(max(I, IS), BN)): program j < n_active owns expert active[j] and loops
               over its picks (token t = pick // k, slot = pick % k), the last row of programs owns the shared
               expert and loops over all T tokens; each (token, slot) row is the SAME helper (triton_moe_gemv.swiglu_block),
               with the same compile-time shape (BN, CG, INLINE, num_warps), as moe_decode_v2's gate/up program
  down         the same over H through v2's down_block: part[t * SLOTS + slot] = w * bf16(h . Wd)
  combine      v2's combine (slots summed in order, + residual)

So a token's output is bit-identical to moe_decode_v2's whatever the batch (tests: `check_moe_experts_major`), and
a caller may pick either path by T without breaking batch invariance. The weights of one (expert, feature block)
are re-read from L1/L2 for each of its picks, not from DRAM. Not yet timed on a GPU: the model still uses v2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant.triton_gemv import MAGIC
from ..quant.triton_gemv_inline import inline_mode
from .triton_moe_gemv import (
    MoeLaunch,
    _cg,
    _group,
    _routing,
    down_block,
    expert_specs,
    launch_combine,
    slot_buffers,
    swiglu_block,
)


@triton.jit
def _lists_kernel(ids_ptr, order_ptr, active_ptr, first_ptr, count_ptr, nact_ptr, TK, E,
                  TKP: tl.constexpr, EP: tl.constexpr):
    # one program: order[i] = the i-th pick in (expert, pick) order; active[0 .. n-1] the distinct experts
    # ascending, first[e] / count[e] the position of expert e's first pick in `order` and its number of picks
    r = tl.arange(0, TKP)
    valid = r < TK
    e = tl.load(ids_ptr + r, mask=valid, other=E).to(tl.int64)  # padding sorts last (expert E)
    keys = tl.sort(e * TKP + r)
    tl.store(order_ptr + r, (keys % TKP).to(tl.int32), mask=valid)
    ex = tl.arange(0, EP)
    count = tl.histogram(tl.where(valid, e, 0).to(tl.int32), EP, mask=valid)  # [EP] picks per expert
    first = tl.cumsum(count, axis=0) - count
    used = count > 0
    rank = tl.cumsum(used.to(tl.int32), axis=0) - 1
    tl.store(count_ptr + ex, count, mask=ex < E)
    tl.store(first_ptr + ex, first, mask=ex < E)
    tl.store(active_ptr + rank, ex.to(tl.int32), mask=used & (ex < E))
    tl.store(nact_ptr, tl.sum(used.to(tl.int32), axis=0))


@triton.jit
def _gate_up_experts_kernel(
    x_ptr, order_ptr, active_ptr, first_ptr, count_ptr, nact_ptr, h_ptr,
    gw, gs, gb, uw, us, ub, sgw, sgs, sgb, suw, sus, sub,
    T, I, IS, magic, stride_xt, stride_ht, stride_hs,
    stride_ge, stride_gn, stride_gse, stride_gsn, stride_ue, stride_un, stride_use, stride_usn,
    stride_sgn, stride_sgsn, stride_sun, stride_susn,
    H: tl.constexpr, TOPK: tl.constexpr, NE: tl.constexpr, BN: tl.constexpr,
    BITS: tl.constexpr, GROUP: tl.constexpr, CG: tl.constexpr,
    S_BITS: tl.constexpr, S_GROUP: tl.constexpr, S_CG: tl.constexpr, HAS_SHARED: tl.constexpr,
    INLINE: tl.constexpr,
):
    # grid (NE + 1, cdiv(max(I, IS), BN)); program j < n_active: expert active[j]; j == NE: the shared expert
    j = tl.program_id(0)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    if j < NE:
        if j < tl.load(nact_ptr):
            e = tl.load(active_ptr + j).to(tl.int64)
            n_mask = rn < I
            start = tl.load(first_ptr + e)
            for i in range(start, start + tl.load(count_ptr + e)):
                pick = tl.load(order_ptr + i)
                t = pick // TOPK
                slot = pick % TOPK
                x_row = x_ptr + tl.cast(t, tl.int64) * stride_xt
                swiglu_block(x_row, x_row, x_row, gw + e * stride_ge, gs + e * stride_gse, gb + e * stride_gse,
                             uw + e * stride_ue, us + e * stride_use, ub + e * stride_use,
                             h_ptr + tl.cast(t, tl.int64) * stride_ht + slot * stride_hs, rn, n_mask,
                             stride_gn, stride_gsn, stride_un, stride_usn, magic, H, BITS, GROUP, BN, CG, INLINE)
    else:
        if HAS_SHARED:
            n_mask = rn < IS
            for t in range(0, T):
                x_row = x_ptr + tl.cast(t, tl.int64) * stride_xt
                swiglu_block(x_row, x_row, x_row, sgw, sgs, sgb, suw, sus, sub,
                             h_ptr + tl.cast(t, tl.int64) * stride_ht + TOPK * stride_hs, rn, n_mask,
                             stride_sgn, stride_sgsn, stride_sun, stride_susn, magic, H, S_BITS, S_GROUP, BN, S_CG,
                             INLINE)


@triton.jit
def _down_experts_kernel(
    h_ptr, order_ptr, active_ptr, first_ptr, count_ptr, nact_ptr, wts_ptr, sw_ptr, part_ptr,
    dw, ds, db, sdw, sds, sdb,
    T, H, magic, stride_hr, stride_de, stride_dn, stride_dse, stride_dsn, stride_sdn, stride_sdsn,
    I: tl.constexpr, IS: tl.constexpr, TOPK: tl.constexpr, SLOTS: tl.constexpr, NE: tl.constexpr,
    BN: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, CG: tl.constexpr,
    S_BITS: tl.constexpr, S_GROUP: tl.constexpr, S_CG: tl.constexpr, HAS_SHARED: tl.constexpr,
    INLINE: tl.constexpr,
):
    # grid (NE + 1, cdiv(H, BN)); row r = t * SLOTS + slot of hbuf and part, as moe_decode_v2's _down_kernel
    j = tl.program_id(0)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = rn < H
    if j < NE:
        if j < tl.load(nact_ptr):
            e = tl.load(active_ptr + j).to(tl.int64)
            start = tl.load(first_ptr + e)
            for i in range(start, start + tl.load(count_ptr + e)):
                pick = tl.load(order_ptr + i)
                t = pick // TOPK
                slot = pick % TOPK
                r = t * SLOTS + slot
                h_row = h_ptr + tl.cast(r, tl.int64) * stride_hr
                down_block(h_row, h_row, h_row, dw + e * stride_de, ds + e * stride_dse, db + e * stride_dse,
                           tl.load(wts_ptr + t * TOPK + slot), part_ptr + tl.cast(r, tl.int64) * H, rn, n_mask,
                           stride_dn, stride_dsn, magic, I, BITS, GROUP, BN, CG, INLINE)
    else:
        if HAS_SHARED:
            for t in range(0, T):
                r = t * SLOTS + TOPK
                h_row = h_ptr + tl.cast(r, tl.int64) * stride_hr
                down_block(h_row, h_row, h_row, sdw, sds, sdb, tl.load(sw_ptr + t), part_ptr + tl.cast(r, tl.int64) * H,
                           rn, n_mask, stride_sdn, stride_sdsn, magic, IS, S_BITS, S_GROUP, BN, S_CG, INLINE)


def expert_lists(ids: torch.Tensor, num_experts: int):
    """(order [T*k] int32, active [min(E, T*k)] int32, first [E], count [E] int32, n_active [1]) of routing ids
    [T, k] (one launch, no host sync: the grid of the expert kernels is sized by min(E, T*k), its idle programs
    read n_active and return)."""
    tk = ids.numel()
    dev = ids.device
    order = torch.empty(tk, dtype=torch.int32, device=dev)
    active = torch.empty(min(num_experts, tk), dtype=torch.int32, device=dev)
    first = torch.empty(num_experts, dtype=torch.int32, device=dev)
    count = torch.empty(num_experts, dtype=torch.int32, device=dev)
    n_active = torch.empty(1, dtype=torch.int32, device=dev)
    if tk:
        _lists_kernel[(1,)](ids.reshape(-1), order, active, first, count, n_active, tk, num_experts,
                            TKP=triton.next_power_of_2(tk), EP=triton.next_power_of_2(num_experts), num_warps=4)
    return order, active, first, count, n_active


def moe_decode_experts_major(
    x: torch.Tensor, router, gate, up, down, top_k: int, *, normalize: bool = True,
    shared_gate_proj=None, shared_up=None, shared_down=None, shared_gate=None,
    residual: torch.Tensor | None = None, return_routing: bool = False, out: torch.Tensor | None = None,
    config: dict | None = None, launch: MoeLaunch | None = None,
):
    """The MoE block for T tokens x [T, H] (bf16), arguments and result as `moe_decode_v2` (x read raw, the top-k
    at the router's last arrival), bit-identical to it for every token, each picked expert read once. Launches:
    router, lists, gate/up, down, combine. Meant for many tokens per step (T * k >~ E); T * k <= 4096 (the lists
    kernel sorts all picks in one program)."""
    launch = MoeLaunch() if launch is None else launch
    t, h = x.shape
    g, u, d, sg, su, sd, has_shared = expert_specs(
        x, router, gate, up, down, shared_gate_proj, shared_up, shared_down, shared_gate, residual
    )
    if t * top_k > 4096:
        raise ValueError(f"moe_decode_experts_major: {t} tokens x top-{top_k} = {t * top_k} picks > 4096")
    routing, _ = _routing(x, router, top_k, normalize, shared_gate, config, False)
    out = torch.empty_like(x) if out is None else out
    if t == 0:
        return (out, routing) if return_routing else out
    order, active, first, count, n_active = expert_lists(routing.ids, g.w.shape[0])
    ne = active.numel()
    i_s, slots, hbuf, part = slot_buffers(x, g, sg, has_shared, top_k)
    bn = launch.gate_up_bn
    _gate_up_experts_kernel[(ne + 1, triton.cdiv(hbuf.shape[2], bn))](
        x, order, active, first, count, n_active, hbuf,
        g.w, g.scales, g.biases, u.w, u.scales, u.biases, sg.w, sg.scales, sg.biases, su.w, su.scales, su.biases,
        t, g.n, i_s, MAGIC, x.stride(0), hbuf.stride(0), hbuf.stride(1),
        g.w.stride(0), g.w.stride(1), g.scales.stride(0), g.scales.stride(1),
        u.w.stride(0), u.w.stride(1), u.scales.stride(0), u.scales.stride(1),
        sg.w.stride(-2), sg.scales.stride(-2), su.w.stride(-2), su.scales.stride(-2),
        H=h, TOPK=top_k, NE=ne, BN=bn, BITS=g.bits, GROUP=_group(g), CG=_cg(g, bn, launch.gate_up_cg),
        S_BITS=sg.bits, S_GROUP=_group(sg), S_CG=_cg(sg, bn, launch.gate_up_cg), HAS_SHARED=has_shared,
        INLINE=inline_mode(x, True), num_warps=launch.gate_up_warps,
    )
    rows = hbuf.view(t * slots, hbuf.shape[2])
    bn = launch.down_bn
    _down_experts_kernel[(ne + 1, triton.cdiv(h, bn))](
        rows, order, active, first, count, n_active, routing.weights, routing.shared_weight, part,
        d.w, d.scales, d.biases, sd.w, sd.scales, sd.biases,
        t, h, MAGIC, rows.stride(0), d.w.stride(0), d.w.stride(1), d.scales.stride(0), d.scales.stride(1),
        sd.w.stride(-2), sd.scales.stride(-2),
        I=d.k, IS=i_s if has_shared else d.k, TOPK=top_k, SLOTS=slots, NE=ne, BN=bn,
        BITS=d.bits, GROUP=_group(d), CG=_cg(d, bn, launch.down_cg), S_BITS=sd.bits, S_GROUP=_group(sd),
        S_CG=_cg(sd, bn, launch.down_cg), HAS_SHARED=has_shared, INLINE=inline_mode(rows, True),
        num_warps=launch.down_warps,
    )
    launch_combine(part, x, residual, out, slots, launch)
    return (out, routing) if return_routing else out

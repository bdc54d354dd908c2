"""Gated attention's q/k preparation in one launch: q_norm, k_norm, partial RoPE, the K/V cache append, q made
contiguous. Replaces rms_norm x2 -> rope_cos_sin -> apply_rope x2 -> q.contiguous() -> write_kv (tens of launches).

Same meaning and rounding points as that sequence (kernels/norm.py, kernels/rope.py, attention/reference.py):
  n   = bf16( x * 1/sqrt(mean(x^2) + eps) * (offset + w) )                   per head of D, fp32 inside
  ang = fp32(pos) * inv_freq[j]  (fp32; inv_freq = rope.rope_inv_freq)        j < rotary_dim/2 = HALF
  out[j]        = bf16( n[j] * cos(ang) - n[j + HALF] * sin(ang) )            j < HALF
  out[j + HALF] = bf16( n[j + HALF] * cos(ang) + n[j] * sin(ang) )
  out[j]        = n[j]                                                         rotary_dim <= j < D (pass-through)
Positions: [T] (text) or [3, T] (T/H/W ids, (interleaved) mRoPE: frequency j reads its axis as rope_cos_sin
decides); a text-only [3, T] with equal rows gives the [T] result exactly.

Grid (T, Hq + Hkv): program (t, h < Hq) writes q_out[t, h]; program (t, Hq + i) writes k_cache/v_cache at
slot_mapping[t] for KV head i (a negative slot is padding: nothing written). Each program's result depends only
on its own token and head, so a row never depends on the batch.

Not guaranteed bit-identical to the unfused sequence on the GPU (the tests hold the difference to 1 bf16 ulp per
element): the compiler may contract n*cos - n2*sin into an FMA, tl.cos/tl.sin are not torch's cos/sin, and the
sum of squares' reduction tree may differ from triton_norm.rms_norm's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_pdl import pdl_args, pdl_open, pdl_wait
from .kv_fp8 import check_cache
from .triton_kv_fp8 import fp8_scale, store_fp8


@triton.jit
def _inv_rms(row_ptr, w_ptr, eps, offset, D: tl.constexpr, BD: tl.constexpr):
    """1/rms of one head row (fp32 scalar) and its normalised, rounded values n [BD] (0 beyond D)."""
    rd = tl.arange(0, BD)
    m = rd < D
    xf = tl.load(row_ptr + rd, mask=m, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    w = tl.load(w_ptr + rd, mask=m, other=0.0).to(tl.float32)
    return inv, (xf * inv * (offset + w)).to(row_ptr.dtype.element_ty)


@triton.jit
def _rope_angles(pos_ptr, invf_ptr, t, stride_pa, stride_pt, HALF: tl.constexpr, HP: tl.constexpr,
                 SEC0: tl.constexpr, SEC1: tl.constexpr, SEC2: tl.constexpr, INTERLEAVED: tl.constexpr):
    """cos, sin [HP] (fp32) of token t's frequencies j < HALF. stride_pa = 0 for 1-D positions (every axis reads
    the same id). Axis of frequency j as in rope.rope_cos_sin: interleaved H if j % 3 == 1 and j < 3*SEC1, W if
    j % 3 == 2 and j < 3*SEC2; contiguous H for SEC0 <= j < SEC0 + SEC1, W beyond; T otherwise."""
    j = tl.arange(0, HP)
    jm = j < HALF
    if INTERLEAVED:
        axis = tl.where((j % 3 == 1) & (j < 3 * SEC1), 1, tl.where((j % 3 == 2) & (j < 3 * SEC2), 2, 0))
    else:
        axis = tl.where(j >= SEC0 + SEC1, 2, tl.where(j >= SEC0, 1, 0))
    pos = tl.load(pos_ptr + axis.to(tl.int64) * stride_pa + t.to(tl.int64) * stride_pt, mask=jm, other=0)
    ang = pos.to(tl.float32) * tl.load(invf_ptr + j, mask=jm, other=0.0)
    return tl.cos(ang), tl.sin(ang)


@triton.jit
def _rotated_halves(src_ptr, w_ptr, inv, cos, sin, offset, HALF: tl.constexpr, HP: tl.constexpr):
    """The rotary pairs (j, j+HALF) of a row, re-normalised from two half loads (elementwise, so the same bits as
    the full row's) and rotated: (j [HP], its mask, r1, r2 fp32, not yet rounded to the destination)."""
    j = tl.arange(0, HP)
    jm = j < HALF
    act = src_ptr.dtype.element_ty
    x1 = tl.load(src_ptr + j, mask=jm, other=0.0).to(tl.float32)
    x2 = tl.load(src_ptr + HALF + j, mask=jm, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + j, mask=jm, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + j, mask=jm, other=0.0).to(tl.float32)
    n1 = (x1 * inv * (offset + w1)).to(act).to(tl.float32)
    n2 = (x2 * inv * (offset + w2)).to(act).to(tl.float32)
    return j, jm, n1 * cos - n2 * sin, n2 * cos + n1 * sin


@triton.jit
def _norm_rope_store(src_ptr, w_ptr, dst_ptr, cos, sin, eps, offset, D: tl.constexpr, BD: tl.constexpr,
                     HALF: tl.constexpr, HP: tl.constexpr):
    """dst[0:D] = RoPE(rms_norm(src[0:D])): the pass-through part from the full row, the rotary pairs from
    _rotated_halves."""
    inv, n = _inv_rms(src_ptr, w_ptr, eps, offset, D, BD)
    rd = tl.arange(0, BD)
    tl.store(dst_ptr + rd, n.to(dst_ptr.dtype.element_ty), mask=(rd >= 2 * HALF) & (rd < D))
    j, jm, r1, r2 = _rotated_halves(src_ptr, w_ptr, inv, cos, sin, offset, HALF, HP)
    tl.store(dst_ptr + j, r1.to(dst_ptr.dtype.element_ty), mask=jm)
    tl.store(dst_ptr + HALF + j, r2.to(dst_ptr.dtype.element_ty), mask=jm)


@triton.jit
def _norm_rope_store_fp8(src_ptr, w_ptr, dst_ptr, scale_ptr, cos, sin, eps, offset, D: tl.constexpr,
                         BD: tl.constexpr, HALF: tl.constexpr, HP: tl.constexpr):
    """_norm_rope_store's row (each value rounded to the activation dtype, as the bf16 cache holds it) into an fp8
    cache row with its scale (kv_fp8's format: amax over the whole row, then each piece quantised)."""
    inv, n = _inv_rms(src_ptr, w_ptr, eps, offset, D, BD)
    rd = tl.arange(0, BD)
    pm = (rd >= 2 * HALF) & (rd < D)
    npass = n.to(tl.float32)
    j, jm, r1, r2 = _rotated_halves(src_ptr, w_ptr, inv, cos, sin, offset, HALF, HP)
    act = src_ptr.dtype.element_ty
    o1 = r1.to(act).to(tl.float32)
    o2 = r2.to(act).to(tl.float32)
    amax = tl.maximum(tl.max(tl.where(pm, tl.abs(npass), 0.0), axis=0),
                      tl.maximum(tl.max(tl.where(jm, tl.abs(o1), 0.0), axis=0),
                                 tl.max(tl.where(jm, tl.abs(o2), 0.0), axis=0)))
    scale = fp8_scale(amax)
    store_fp8(dst_ptr + rd, npass, scale, pm)
    store_fp8(dst_ptr + j, o1, scale, jm)
    store_fp8(dst_ptr + HALF + j, o2, scale, jm)
    tl.store(scale_ptr, scale)


@triton.jit
def _qk_prep_kernel(
    q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, pos_ptr, invf_ptr, cos_ptr, sin_ptr, qo_ptr, kc_ptr, vc_ptr, slot_ptr,
    ks_ptr, vs_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_pa, stride_pt,
    stride_ct, stride_st, stride_cs, stride_ch, eps, offset,
    HQ: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, HALF: tl.constexpr, HP: tl.constexpr,
    SEC0: tl.constexpr, SEC1: tl.constexpr, SEC2: tl.constexpr, INTERLEAVED: tl.constexpr, TABLE: tl.constexpr,
    FP8: tl.constexpr = False, PDL: tl.constexpr = False,
):
    # grid (T, HQ + HKV); caches viewed as [num_blocks * block_size, HKV, D]; FP8: e4m3 caches with their scales
    # ks/vs viewed as [num_blocks * block_size, HKV] (kv_fp8.py)
    pdl_open(PDL)
    pdl_wait(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    t64 = t.to(tl.int64)
    if TABLE:  # rope_cos_sin's [T, rotary_dim] tables (both halves equal): read the first half
        j = tl.arange(0, HP)
        cos = tl.load(cos_ptr + t64 * stride_ct + j, mask=j < HALF, other=0.0)
        sin = tl.load(sin_ptr + t64 * stride_st + j, mask=j < HALF, other=0.0)
    else:
        cos, sin = _rope_angles(pos_ptr, invf_ptr, t, stride_pa, stride_pt, HALF, HP, SEC0, SEC1, SEC2,
                                INTERLEAVED)
    if h < HQ:
        _norm_rope_store(q_ptr + t64 * stride_qt + h * stride_qh, qw_ptr, qo_ptr + t64 * stride_ot + h * stride_oh,
                         cos, sin, eps, offset, D, BD, HALF, HP)
    else:
        kvh = h - HQ
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:  # a negative slot is a padding token
            dst = slot * stride_cs + kvh * stride_ch
            rd = tl.arange(0, BD)
            if FP8:
                srow = slot * (stride_cs // D) + kvh  # the scales' row: [rows, HKV] contiguous
                _norm_rope_store_fp8(k_ptr + t64 * stride_kt + kvh * stride_kh, kw_ptr, kc_ptr + dst, ks_ptr + srow,
                                     cos, sin, eps, offset, D, BD, HALF, HP)
                vf = tl.load(v_ptr + t64 * stride_vt + kvh * stride_vh + rd, mask=rd < D).to(tl.float32)
                vscale = fp8_scale(tl.max(tl.where(rd < D, tl.abs(vf), 0.0), axis=0))
                store_fp8(vc_ptr + dst + rd, vf, vscale, rd < D)
                tl.store(vs_ptr + srow, vscale)
            else:
                _norm_rope_store(k_ptr + t64 * stride_kt + kvh * stride_kh, kw_ptr, kc_ptr + dst, cos, sin, eps,
                                 offset, D, BD, HALF, HP)
                v = tl.load(v_ptr + t64 * stride_vt + kvh * stride_vh + rd, mask=rd < D)
                tl.store(vc_ptr + dst + rd, v.to(vc_ptr.dtype.element_ty), mask=rd < D)


def _position_strides(positions: torch.Tensor, t: int) -> tuple[int, int]:
    """(axis stride, token stride) of positions [T] or [3, T]; anything else is refused."""
    if positions.dtype.is_floating_point or positions.dtype == torch.bool:
        raise ValueError(f"qk_norm_rope_write: positions must be integer ids, got {positions.dtype}")
    if positions.dim() == 1 and positions.shape[0] == t:
        return 0, positions.stride(0)
    if positions.dim() == 2 and tuple(positions.shape) == (3, t):
        return positions.stride(0), positions.stride(1)
    raise ValueError(f"qk_norm_rope_write: positions {tuple(positions.shape)} unsupported; expected [{t}] (text) or "
                     f"[3, {t}] (T/H/W mRoPE ids)")


def _sections(positions: torch.Tensor, half: int, mrope_section, interleaved: bool) -> tuple[int, int, int]:
    """The (SEC0, SEC1, SEC2) constants: rope_cos_sin's axis choice, T everywhere for 1-D positions."""
    if positions.dim() == 1 or mrope_section is None:
        return (half, 0, 0)
    sec = tuple(int(s) for s in mrope_section)
    if len(sec) != 3 or sum(sec) != half:
        raise ValueError(f"qk_norm_rope_write: mrope_section {sec} must be 3 sections summing to {half}")
    return sec


def _check(q, k, v, q_norm_w, k_norm_w, inv_freq, k_cache, v_cache, slot_mapping) -> None:
    t, hq, d = q.shape
    hkv, dc = k_cache.shape[2:]
    half = inv_freq.numel()
    if tuple(k.shape) != (t, hkv, d) or tuple(v.shape) != (t, hkv, d) or dc != d or slot_mapping.numel() != t:
        raise ValueError(f"qk_norm_rope_write: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"{slot_mapping.numel()} slots, cache {tuple(k_cache.shape)} disagree")
    if q_norm_w.numel() != d or k_norm_w.numel() != d or not 0 < 2 * half <= d or inv_freq.dtype != torch.float32:
        raise ValueError(f"qk_norm_rope_write: norm weights {q_norm_w.numel()}/{k_norm_w.numel()} for D={d}, "
                         f"inv_freq {half} x {inv_freq.dtype} (need rotary_dim/2 <= D/2 in fp32)")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1 or not (
            k_cache.is_contiguous() and v_cache.is_contiguous() and inv_freq.is_contiguous()):
        raise ValueError("qk_norm_rope_write: q/k/v must be contiguous along D, caches and inv_freq contiguous")


def qk_norm_rope_write(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm_w: torch.Tensor, k_norm_w: torch.Tensor, eps: float,
    offset: float, positions: torch.Tensor, inv_freq: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, mrope_section: tuple[int, ...] | None = None, mrope_interleaved: bool = True,
    out: torch.Tensor | None = None, cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, D] (any token/head strides: e.g. qg.view(T, Hq, 2D)[..., :D] of the q|gate projection), k, v
    [T, Hkv, D]; norm weights [D]; positions [T] or [3, T] integer; inv_freq [rotary_dim/2] fp32
    (rope.rope_inv_freq, computed once); caches [num_blocks, block_size, Hkv, D] contiguous; slot_mapping [T]
    (negative = padding, not written). Writes the normed, rotated k and the raw v into the cache and returns the
    normed, rotated q as a contiguous [T, Hq, D] (into `out` when given). cos_sin: optionally rope_cos_sin's fp32
    tables [T, rotary_dim] to use instead of the in-kernel cos/sin (positions are then only validated).
    fp8 caches (kv_fp8.py) take k_scale, v_scale [num_blocks, block_size, Hkv] fp32: each written row is the
    bf16 row quantised by kv_fp8.quantize_rows."""
    t, hq, d = q.shape
    hkv, half = k_cache.shape[2], inv_freq.numel()
    _check(q, k, v, q_norm_w, k_norm_w, inv_freq, k_cache, v_cache, slot_mapping)
    stride_pa, stride_pt = _position_strides(positions, t)
    sec = _sections(positions, half, mrope_section, mrope_interleaved)
    out = torch.empty(t, hq, d, dtype=q.dtype, device=q.device) if out is None else out
    if out.shape != (t, hq, d) or out.stride(-1) != 1:
        raise ValueError(f"qk_norm_rope_write: out {tuple(out.shape)} must be [{t}, {hq}, {d}], contiguous along D")
    cos, sin = cos_sin if cos_sin is not None else (inv_freq, inv_freq)  # (unread without tables)
    if cos_sin is not None and any(tuple(c.shape) != (t, 2 * half) or c.dtype != torch.float32 or c.stride(-1) != 1
                                   for c in cos_sin):
        raise ValueError(f"qk_norm_rope_write: cos_sin must be fp32 [{t}, {2 * half}] tables, contiguous along "
                         "the rotary axis")
    fp8 = check_cache(k_cache, v_cache, k_scale, v_scale, "qk_norm_rope_write")
    if t:
        _qk_prep_kernel[(t, hq + hkv)](
            q, k, v, q_norm_w, k_norm_w, positions, inv_freq, cos, sin, out, k_cache, v_cache, slot_mapping,
            k_scale if fp8 else out, v_scale if fp8 else out, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0),
            out.stride(1), stride_pa, stride_pt, cos.stride(0), sin.stride(0), hkv * d, d, eps, offset,
            HQ=hq, D=d, BD=triton.next_power_of_2(d), HALF=half, HP=triton.next_power_of_2(half),
            SEC0=sec[0], SEC1=sec[1], SEC2=sec[2], INTERLEAVED=bool(mrope_interleaved),
            TABLE=cos_sin is not None, FP8=fp8, num_warps=4, **pdl_args(out),
        )
    return out

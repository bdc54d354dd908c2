"""Shared Triton building blocks: the affine (MLX) weight-tile decoder and a dot that the interpreter can run.

Weight formats read by every Triton kernel here (BITS is a compile-time constant):

  BITS in (2, 4, 8)  MLX affine: w uint32 [.., N, K*BITS/32] (value i of a word sits at bits [i*BITS, (i+1)*BITS),
                     lowest first), scales and biases [.., N, K/GROUP]; w[n, k] = s[n, k//GROUP] * q + b[n, k//GROUP]
                     evaluated in fp32 (the reference rounds that once to the activation dtype).
  BITS == 16         a dense weight [.., N, K] in bf16/fp16/fp32 (scales and biases are ignored).

The K axis of every weight is contiguous (stride 1); the N and expert axes may have any stride, so views such as
gate_up_proj[:, :I] need no copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import backend

AFFINE_BITS = (2, 4, 8)
DENSE_BITS = 16


@triton.jit
def code_prescale(i, BITS: tl.constexpr):
    """2^-(BITS * (i % (PACK/2))), exactly (built from its fp32 bits): the power of two the shift-free decode leaves
    on code i of a word (PACK = 32 / BITS codes), which the prep folds into x. Every prep writer uses it (prep_row,
    the DeltaNet step's _prep_head), so their xp are the same bits."""
    HALF: tl.constexpr = (32 // BITS) // 2
    return ((127 - BITS * (i % HALF)) << 23).to(tl.float32, bitcast=True)


@triton.jit
def dequant_tile(
    w_ptr, s_ptr, b_ptr, rn, n_mask, k0, stride_wn, stride_sn,
    BN: tl.constexpr, BK: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr,
):
    """W[rn, k0:k0+BK] as fp32 [BN, BK]; rows outside n_mask read as 0. k0 is a multiple of BK (and of GROUP when
    BK >= GROUP), BK a multiple of 32/BITS."""
    if BITS == 16:
        rk = k0 + tl.arange(0, BK)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=n_mask[:, None], other=0.0)
        return w.to(tl.float32)
    else:
        PACK: tl.constexpr = 32 // BITS
        GSUB: tl.constexpr = GROUP if GROUP < BK else BK  # elements of one group inside the tile
        NG: tl.constexpr = BK // GSUB  # groups touched by the tile
        cols = k0 // PACK + tl.arange(0, BK // PACK)
        p = tl.load(w_ptr + rn[:, None] * stride_wn + cols[None, :], mask=n_mask[:, None], other=0)
        shifts = tl.arange(0, PACK) * BITS
        q = (p[:, :, None] >> shifts[None, None, :]) & ((1 << BITS) - 1)  # [BN, BK/PACK, PACK], value k = PACK*j + i
        # int -> float without the quarter-rate I2F: 2^23 + q has q in its mantissa, exactly
        q = (tl.reshape(q, (BN, NG, GSUB)) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        g = k0 // GROUP + tl.arange(0, NG)
        s = tl.load(s_ptr + rn[:, None] * stride_sn + g[None, :], mask=n_mask[:, None], other=0.0).to(tl.float32)
        b = tl.load(b_ptr + rn[:, None] * stride_sn + g[None, :], mask=n_mask[:, None], other=0.0).to(tl.float32)
        w = q * s[:, :, None] + b[:, :, None]
        return tl.reshape(w, (BN, BK))


@triton.jit
def residual_sum(x, res, act: tl.constexpr):
    """r = act(x + res) in fp32 (the decoder layer's x + h before its norm), as every add-norm writer rounds it."""
    return (x.to(tl.float32) + res.to(tl.float32)).to(act)


@triton.jit
def rms_scaled(rf, inv, offset, w, act: tl.constexpr):
    """y = act(r * inv * (offset + w)) from fp32 r and w: the RMSNorm's output element, one formula for the norm
    kernel and for the kernels that make the same norm themselves (the MoE router launch), so the same bits."""
    return (rf * inv * (offset + w)).to(act)


@triton.jit
def mma(a, b, acc, F32: tl.constexpr):
    """acc + a @ b with fp32 accumulation. F32 upcasts the operands first: the Triton 3.6 interpreter gets bf16
    dots wrong, so interpreter runs (F32 = True) compute the same exact products in fp32."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


def dot_f32() -> bool:
    """The F32 flag for `mma`: True under the interpreter."""
    return backend.interpreting()


class WeightSpec:
    """One weight as the kernels read it: (w, scales, biases, bits, group). Dense weights have bits 16 and no
    scales/biases (the weight tensor stands in for them as an unused pointer)."""

    __slots__ = ("w", "scales", "biases", "bits", "group", "n", "k")

    def __init__(self, w: torch.Tensor, scales: torch.Tensor | None, biases: torch.Tensor | None, bits: int,
                 group: int, name: str = "weight"):
        if bits == DENSE_BITS:
            if w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
                raise ValueError(f"{name}: a dense weight must be bf16/fp16/fp32, found {w.dtype}")
            self.n, self.k = w.shape[-2], w.shape[-1]
            scales = biases = w
            group = 1
        elif bits in AFFINE_BITS:
            if w.dtype not in (torch.uint32, torch.int32):
                raise ValueError(f"{name}: packed affine weight must be uint32, found {w.dtype}")
            if scales is None or biases is None:
                raise ValueError(f"{name}: a {bits}-bit affine weight needs scales and biases")
            if group not in (32, 64, 128):
                raise ValueError(f"{name}: unsupported group size {group} (32, 64 or 128)")
            self.n, self.k = w.shape[-2], w.shape[-1] * 32 // bits
            want = (*w.shape[:-1], self.k // group)
            for label, t in (("scales", scales), ("biases", biases)):
                if tuple(t.shape) != want:
                    raise ValueError(f"{name}: {label} shape {tuple(t.shape)}, expected {want} for a packed "
                                     f"weight {tuple(w.shape)} at {bits} bits, group {group}")
                if t.stride(-1) != 1:
                    raise ValueError(f"{name}: {label} must be contiguous along the group axis")
            w = w.view(torch.int32)  # same bits; Triton shifts int32 and masks, so the sign never leaks
        else:
            raise ValueError(f"{name}: unsupported bits {bits}; the Triton kernels read 2, 4, 8 (affine) or 16 (dense)")
        if w.stride(-1) != 1:
            raise ValueError(f"{name}: the K axis must be contiguous (stride 1), found strides {tuple(w.stride())}")
        self.w, self.scales, self.biases, self.bits, self.group = w, scales, biases, bits, group

    @classmethod
    def dense(cls, w: torch.Tensor, name: str = "weight") -> "WeightSpec":
        return cls(w, None, None, DENSE_BITS, 1, name)

    def block_k(self, prefer: int = 128) -> int:
        """Largest K tile <= prefer that divides K and holds whole groups, or lies inside one group."""
        for bk in (512, 256, 128, 64, 32, 16):
            if bk > prefer or self.k % bk:
                continue
            if self.bits == DENSE_BITS or bk % self.group == 0 or self.group % bk == 0:
                return bk
        raise ValueError(f"K = {self.k} has no usable tile (needs a multiple of 16)")

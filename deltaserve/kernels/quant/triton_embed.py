"""The quantised embedding lookup as one kernel (GPU): rows ids of a packed [V, H] affine table -> bf16 [T, H].

Same meaning and bits as `kernels/quant/affine.affine_gather_rows` (the reference: unpack, then scale * q + bias in
fp32, rounded once): for bits 2, 4 and 8 a code q <= 255 times a bf16 scale is exact in fp32, so the kernel's
fused multiply-add rounds once where the reference's multiply then add does, on the same exact product: the same
bits. Packing (MLX): element j of a row is bits [bits * (j % P), bits * (j % P + 1)) of word j // P, P = 32 / bits.

Why a kernel: the reference gather is ~13 torch launches (index, unpack, dequantise) at the head of every decode
step. This kernel is launched WITHOUT programmatic dependent launch: it is the forward's first kernel, and the
kernels that read state before their PDL wait (kernels/triton_pdl.py) rely on the forward starting with a launch
that waits for everything before it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

EMBED_BITS = (2, 4, 8)  # the widths whose codes never straddle two words


@triton.jit
def _embed_kernel(ids_ptr, w_ptr, s_ptr, b_ptr, out_ptr, H, stride_w, stride_s, stride_o,
                  BITS: tl.constexpr, GROUP: tl.constexpr, BH: tl.constexpr):
    # grid (T, cdiv(H, BH)): features [j*BH, (j+1)*BH) of token t's row
    t = tl.program_id(0)
    row = tl.load(ids_ptr + t).to(tl.int64)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    m = cols < H
    per: tl.constexpr = 32 // BITS
    word = tl.load(w_ptr + row * stride_w + cols // per, mask=m, other=0).to(tl.uint32, bitcast=True)
    q = ((word >> ((cols % per) * BITS).to(tl.uint32)) & ((1 << BITS) - 1)).to(tl.float32)
    s = tl.load(s_ptr + row * stride_s + cols // GROUP, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * stride_s + cols // GROUP, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * stride_o + cols, (q * s + b).to(out_ptr.dtype.element_ty), mask=m)


def embed_supported(bits: int, group: int, hidden: int) -> bool:
    """Can affine_embed read this table: bits 2, 4 or 8, and rows of whole groups."""
    return bits in EMBED_BITS and hidden % group == 0


def affine_embed(packed: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, ids: torch.Tensor, bits: int,
                 group: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """packed uint32 [V, H * bits / 32], scales / biases [V, H / group] (bf16), ids [T] integer -> [T, H] in the
    scales' dtype (= affine_gather_rows). ids must lie in [0, V) (checked by the caller where they come from the
    host: a device-side check would cost a synchronisation)."""
    v, words = packed.shape
    hidden = words * 32 // bits
    if not embed_supported(bits, group, hidden):
        raise ValueError(f"affine_embed: bits {bits} / group {group} for H = {hidden} (bits 2, 4 or 8, H a "
                         "multiple of the group)")
    if scales.shape != (v, hidden // group) or biases.shape != scales.shape:
        raise ValueError(f"affine_embed: scales {tuple(scales.shape)} / biases {tuple(biases.shape)} for a packed "
                         f"table {tuple(packed.shape)} at group {group}: expected ({v}, {hidden // group})")
    if packed.stride(-1) != 1 or scales.stride(-1) != 1 or biases.stride() != scales.stride():
        raise ValueError("affine_embed: packed, scales and biases must be contiguous along their last axis, "
                         "scales and biases alike")
    ids = ids.reshape(-1)
    out = torch.empty(ids.numel(), hidden, dtype=scales.dtype, device=scales.device) if out is None else out
    if ids.numel():
        bh = min(1024, triton.next_power_of_2(hidden))
        _embed_kernel[(ids.numel(), triton.cdiv(hidden, bh))](
            ids, packed.view(torch.int32), scales, biases, out, hidden, packed.stride(0), scales.stride(0),
            out.stride(0), BITS=bits, GROUP=group, BH=bh, num_warps=4,
        )
    return out

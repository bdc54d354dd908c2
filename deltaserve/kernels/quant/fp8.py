"""Qwen FP8 block quantisation (the official -FP8 releases): dequantise, packed matmul, and a block quantiser.

Layout (per linear, [out, in] as nn.Linear):

  weight            [out, in]  float8_e4m3fn; held in memory as its uint8 bit patterns (see below)
  weight_scale_inv  [ceil(out / b0), ceil(in / b1)]  fp32 or bf16, block (b0, b1) = weight_block_size ([128, 128])
  decode            W[r, c] = float(W8[r, c]) * weight_scale_inv[r // b0, c // b1]   (a multiplier, despite the name)

Why uint8 in memory: torch treats float8 as a floating dtype, so `module.to(dtype)` would silently expand every
FP8 weight; the uint8 view of the same bytes is left alone and costs nothing to reinterpret.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

FP8_MAX = 448.0  # largest finite float8_e4m3fn
_MATMUL_CHUNK_ELEMS = 1 << 22


def as_fp8(w: torch.Tensor) -> torch.Tensor:
    """The float8_e4m3fn view of a uint8 bit-pattern tensor (or the tensor itself if already float8)."""
    return w.view(torch.float8_e4m3fn) if w.dtype == torch.uint8 else w


def fp8_block_dequantize(
    w8: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = (128, 128), dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """[..., out, in] FP8 (uint8 bits or float8) and [..., ceil(out/b0), ceil(in/b1)] scales -> dense dtype.

    Evaluated in fp32 and rounded once to dtype."""
    b0, b1 = block
    out, inp = w8.shape[-2:]
    want = (math.ceil(out / b0), math.ceil(inp / b1))
    if tuple(scale_inv.shape[-2:]) != want:
        raise ValueError(
            f"weight_scale_inv shape {list(scale_inv.shape)} does not match weight [{out}, {inp}] with block "
            f"{list(block)}: expected [..., {want[0]}, {want[1]}]"
        )
    s = scale_inv.float().repeat_interleave(b0, dim=-2)[..., :out, :].repeat_interleave(b1, dim=-1)[..., :inp]
    return (as_fp8(w8).float() * s).to(dtype)


def fp8_block_linear(
    x: torch.Tensor, w8: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = (128, 128)
) -> torch.Tensor:
    """y = x W^T with W [out, in] held as FP8 blocks; dequantises b0-aligned blocks of output rows on the fly."""
    b0 = block[0]
    out, inp = w8.shape
    if x.shape[-1] != inp:
        raise ValueError(f"fp8_block_linear: input has {x.shape[-1]} features, weight expects {inp}")
    rows = max(1, _MATMUL_CHUNK_ELEMS // max(1, inp) // b0) * b0
    if rows >= out:
        return F.linear(x, fp8_block_dequantize(w8, scale_inv, block, x.dtype))
    parts = []
    for r in range(0, out, rows):
        s = scale_inv[r // b0 : (r + rows) // b0 + (1 if (r + rows) % b0 else 0)]
        parts.append(F.linear(x, fp8_block_dequantize(w8[r : r + rows], s, block, x.dtype)))
    return torch.cat(parts, dim=-1)


def fp8_block_quantize(
    w: torch.Tensor, block: tuple[int, int] = (128, 128), scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense [out, in] -> (float8_e4m3fn [out, in], scale_inv [ceil(out/b0), ceil(in/b1)]).

    Per block scale = amax / 448 (1 for an all-zero block), so the block's largest magnitude maps to the largest
    finite FP8 value; used to write synthetic checkpoints in the release layout."""
    b0, b1 = block
    out, inp = w.shape
    nr, nc = math.ceil(out / b0), math.ceil(inp / b1)
    padded = torch.zeros(nr * b0, nc * b1, dtype=torch.float32, device=w.device)
    padded[:out, :inp] = w.float()
    blocks = padded.view(nr, b0, nc, b1)
    amax = blocks.abs().amax(dim=(1, 3))  # [nr, nc]
    # divide by a tensor: CUDA turns `t / scalar` into a reciprocal multiply (different rounding from the CPU)
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax)).to(scale_dtype)
    q = (blocks / scale.float()[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    return q.view(nr * b0, nc * b1)[:out, :inp].to(torch.float8_e4m3fn), scale

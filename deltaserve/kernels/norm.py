"""RMSNorm variants of the Qwen3.5 family (reference path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 1.0) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * (offset + w), in fp32, rounded once to x's dtype.

    offset = 1 for the zero-centred norms of the HF checkpoints (w ~ 0 means identity); offset = 0 where the +1 is
    already baked into w (MLX checkpoints).
    """
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (offset + weight.float())).to(x.dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """DeltaNet output norm: (x / rms(x)) * w (plain w, not 1 + w), then * SiLU(gate); norm before gate.

    x, gate [..., dv]; the rounding points follow the published model (normed x rounded to x's dtype before the
    weight, gate applied in fp32, result rounded once).
    """
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    y = weight.to(x.dtype) * y
    return (y.float() * F.silu(gate.float())).to(x.dtype)

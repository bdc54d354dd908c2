"""Dense linear algebra used by every layer (reference path: plain torch)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x W^T with W [out, in] (bias-free, as every Qwen3.5 projection)."""
    return F.linear(x, weight.to(x.dtype) if weight.dtype != x.dtype else weight)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation: SiLU(gate) * up."""
    return F.silu(gate) * up

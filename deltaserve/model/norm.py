"""Norm modules holding their weights; the math lives in kernels.norm."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import norm as norm_ops


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: weight applied as (offset + w); offset 1 for HF checkpoints, 0 for MLX ones."""

    def __init__(self, dim: int, eps: float, offset: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.eps, self.offset = eps, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return norm_ops.rms_norm(x, self.weight, self.eps, self.offset)


class GatedRMSNorm(nn.Module):
    """DeltaNet output norm: plain weight, then SiLU(gate)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return norm_ops.gated_rms_norm(x, gate, self.weight, self.eps)

"""Norm modules holding their weights; the math lives in kernels.norm."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import norm as norm_ops
from . import fast


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: weight applied as (offset + w); offset 1 for HF checkpoints, 0 for MLX ones."""

    def __init__(self, dim: int, eps: float, offset: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.eps, self.offset = eps, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fast.enabled(x):
            from ..kernels.triton_norm import rms_norm

            return rms_norm(x, self.weight, self.eps, self.offset)
        return norm_ops.rms_norm(x, self.weight, self.eps, self.offset)


class GatedRMSNorm(nn.Module):
    """DeltaNet output norm: plain weight, then SiLU(gate)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if fast.enabled(x):
            from ..kernels.triton_norm import gated_rms_norm

            return gated_rms_norm(x, gate, self.weight, self.eps)
        return norm_ops.gated_rms_norm(x, gate, self.weight, self.eps)

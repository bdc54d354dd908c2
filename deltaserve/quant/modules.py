"""Weight-holding modules shared by the quantised formats, with the model's call contracts:

  linear:      forward(x [..., in]) -> [..., out]
  experts:     forward_expert(x [n, H], e) -> [n, H]
  embedding:   forward(ids [T]) -> [T, H];  as_linear(x [T, H]) -> [T, V]

`quant` may not import `model`, so the dense fallbacks a quantised checkpoint needs for its unquantised layers
(e.g. the routed experts' down_proj when I is not a multiple of the group size) live here. Their parameter names
match the model's dense modules ("weight" [out, in]).

Routed experts in quantised checkpoints are held as MLX stores them: three stacked projections with a leading
expert axis, `gate_proj` [E, I, ...], `up_proj` [E, I, ...], `down_proj` [E, H, ...] (gate and up NOT fused: the
files hold them apart, each may carry its own bits, and loading them stays zero-copy). Each projection is any
`StackedLinear` (dense, affine or FP8).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.linear import silu_mul


def frozen(*shape: int, dtype: torch.dtype | None = None) -> nn.Parameter:
    """An uninitialised, gradient-free parameter (the loader fills it; on the meta device it has no storage)."""
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class DenseLinear(nn.Module):
    """Unquantised bias-free linear; weight [out, in] in the model dtype."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = frozen(out_features, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype))


class DenseEmbedding(nn.Module):
    """Unquantised embedding [V, H]; also the tied output head."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.weight = frozen(vocab, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids]

    def as_linear(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype))


class StackedLinear(nn.Module):
    """E bias-free linears [out, in] stacked on a leading expert axis; forward_one(x, e) applies expert e's."""

    def forward_one(self, x: torch.Tensor, e: int) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError


class DenseStacked(StackedLinear):
    """weight [E, out, in] in the model dtype."""

    def __init__(self, num_experts: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = frozen(num_experts, out_features, in_features)

    def forward_one(self, x: torch.Tensor, e: int) -> torch.Tensor:
        return F.linear(x, self.weight[e].to(x.dtype))


class StackedExperts(nn.Module):
    """Routed experts: y_e = down_e(SiLU(gate_e(x)) * up_e(x)), each projection a StackedLinear."""

    def __init__(self, gate_proj: StackedLinear, up_proj: StackedLinear, down_proj: StackedLinear):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    @classmethod
    def build(cls, stacked, name: str, num_experts: int, hidden: int, intermediate: int) -> StackedExperts:
        """The bank of `name` from a factory's stacked(name, E, in_features, out_features) -> StackedLinear."""
        return cls(
            stacked(f"{name}.gate_proj", num_experts, hidden, intermediate),
            stacked(f"{name}.up_proj", num_experts, hidden, intermediate),
            stacked(f"{name}.down_proj", num_experts, intermediate, hidden),
        )

    def forward_expert(self, x: torch.Tensor, e: int) -> torch.Tensor:
        return self.down_proj.forward_one(silu_mul(self.gate_proj.forward_one(x, e), self.up_proj.forward_one(x, e)), e)

"""Weight-holding building blocks, and the factory through which a checkpoint format chooses them.

The model asks a `WeightFactory` for every linear layer and every expert bank, naming it by its parameter path
(e.g. "layers.0.linear_attn.in_proj_qkv"). The default factory gives dense weights; a quantised format (see
`deltaserve.quant`) gives modules with the same call signatures holding packed weights, so the model code never
changes with the format:

  linear module:  forward(x [..., in]) -> [..., out]
  expert bank:    forward_expert(x [n, H], e: int) -> [n, H]   (SiLU(gate(x)) * up(x), then down)
  embedding:      forward(ids [T]) -> [T, H];  as_linear(x [T, H]) -> [T, V]  (the tied output head)
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from ..kernels import linear as linear_ops


class WeightFactory(Protocol):
    def linear(self, name: str, in_features: int, out_features: int) -> nn.Module: ...

    def experts(self, name: str, num_experts: int, hidden: int, intermediate: int) -> nn.Module: ...

    def embedding(self, name: str, vocab: int, hidden: int) -> nn.Module: ...


def _empty(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class Linear(nn.Module):
    """Dense bias-free linear layer; weight [out, in] as stored in the checkpoint."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = _empty(out_features, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_ops.linear(x, self.weight)


class Experts(nn.Module):
    """Dense routed experts in the published fused layout.

    gate_up_proj [E, 2I, H]: rows 0..I-1 gate, I..2I-1 up.   down_proj [E, H, I].
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        self.gate_up_proj = _empty(num_experts, 2 * intermediate, hidden)
        self.down_proj = _empty(num_experts, hidden, intermediate)

    def forward_expert(self, x: torch.Tensor, e: int) -> torch.Tensor:
        gate_up = linear_ops.linear(x, self.gate_up_proj[e])
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return linear_ops.linear(linear_ops.silu_mul(gate, up), self.down_proj[e])


class Embedding(nn.Module):
    """Token embedding weight [V, H]; also the output head when embeddings are tied."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.weight = _empty(vocab, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids]

    def as_linear(self, x: torch.Tensor) -> torch.Tensor:
        return linear_ops.linear(x, self.weight)


class DenseWeights:
    """The default factory: unquantised weights in the checkpoint dtype."""

    def linear(self, name: str, in_features: int, out_features: int) -> nn.Module:
        return Linear(in_features, out_features)

    def experts(self, name: str, num_experts: int, hidden: int, intermediate: int) -> nn.Module:
        return Experts(num_experts, hidden, intermediate)

    def embedding(self, name: str, vocab: int, hidden: int) -> nn.Module:
        return Embedding(vocab, hidden)
